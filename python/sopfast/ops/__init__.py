"""Fused SOP ops, each a ``torch.autograd.Function`` over ``torch.library`` custom ops with one
dispatcher (CUDA → Triton or CUDA C++, CPU → C++, otherwise the PyTorch reference; override
with :func:`use_backend` or ``SOPFAST_BACKEND``)."""

from ._backends import available_backends, backends, select_backend, use_backend
from .blur import gaussian_kernel1d
from .counts import num_kept
from .gather_tokens import gather_tokens, gather_tokens_backward_reference, gather_tokens_reference
from .group_select import aggregate, aggregate_reference, group_select, group_select_reference
from .sparsemax import sparsemax, sparsemax_backward_reference, sparsemax_reference
from .top_tau import TopTauResult, top_tau, top_tau_backward_reference, top_tau_reference

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
