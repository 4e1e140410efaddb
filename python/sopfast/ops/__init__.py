"""Fused SOP ops, each ``torch.ops.sopfast.<op>`` in PyTorch's dispatcher (schema once, a kernel per
device: CPU → C++, CUDA → Triton or CUDA C++, otherwise the PyTorch reference; autograd once, in
C++; fake kernels for ``torch.compile``), behind checked Python functions; override the kernels
with :func:`use_backend` or ``SOPFAST_BACKEND`` (see :mod:`sopfast.ops._backends`)."""

import warnings

from . import _backends
from ._backends import available_backends, backends, select_backend, use_backend
from .blur import gaussian_kernel1d
from .counts import num_kept
from .gather_tokens import gather_tokens, gather_tokens_backward_reference, gather_tokens_reference
from .group_select import aggregate, aggregate_reference, group_select, group_select_reference
from .sparsemax import sparsemax, sparsemax_backward_reference, sparsemax_reference
from .top_tau import TopTauResult, top_tau, top_tau_backward_reference, top_tau_reference

try:  # SOPFAST_BACKEND, once every op is registered
    _backends.sync_environment()
except (ValueError, RuntimeError) as error:  # raised again where the override is read (backends(), use_backend)
    warnings.warn(f"sopfast: {error}; the default kernels run", RuntimeWarning, stacklevel=2)

__all__ = [
    "TopTauResult",
    "aggregate",
    "aggregate_reference",
    "available_backends",
    "backends",
    "gather_tokens",
    "gather_tokens_backward_reference",
    "gather_tokens_reference",
    "gaussian_kernel1d",
    "group_select",
    "group_select_reference",
    "num_kept",
    "select_backend",
    "sparsemax",
    "sparsemax_backward_reference",
    "sparsemax_reference",
    "top_tau",
    "top_tau_backward_reference",
    "top_tau_reference",
    "use_backend",
]
