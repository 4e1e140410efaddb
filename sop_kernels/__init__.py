"""Triton kernels of sopfast, one kernel family per module (Liger-Kernel style).

Each public function is a Python wrapper that validates shapes, allocates the outputs and
launches the kernels, with the contract of the matching op in :mod:`sopfast.ops`.  Math runs in
fp32 for fp32/fp16/bf16 inputs and in fp64 for fp64 inputs.  Runs on CUDA tensors, or on CPU
tensors under Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from .gather_tokens import gather_tokens_backward, gather_tokens_forward
from .sparsemax import sparsemax_backward, sparsemax_forward
from .top_tau import top_tau_backward, top_tau_forward

__all__ = [
    "gather_tokens_backward",
    "gather_tokens_forward",
    "sparsemax_backward",
    "sparsemax_forward",
    "top_tau_backward",
    "top_tau_forward",
]
