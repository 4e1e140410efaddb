"""Gaussian blur of logit rows on their key grid (torchvision ``gaussian_blur`` semantics).

A row ``[d]`` is viewed as a ``[h, w]`` grid (2-D, images) or as ``d`` positions (1-D,
text), reflect-padded by ``ks // 2`` and convolved with the normalised Gaussian kernel.
The 2-D blur is applied separably (rows then columns), equal to torchvision's 2-D kernel up
to float rounding.

The reference rounds as the kernels do (CPU, CUDA, Triton): a tap loop ``out = 0; out += k[t] · x[t]``
for ``t = 0 … ks − 1``, each product and each sum rounded on its own (no fused multiply-add), so every
backend blurs a row to the same bits and ties between blurred logits fall alike everywhere.  (A matmul
sums the taps in an order of its own: one ulp apart, mirrored positions tie on one device and split on
another.)
"""

from __future__ import annotations

import torch


def gaussian_kernel1d(kernel_size: int, sigma: float, device: torch.device | None = None) -> torch.Tensor:
    """The normalised 1-D Gaussian ``[kernel_size]`` in float32, as torchvision builds it."""
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"blur kernel_size must be a positive odd integer, got {kernel_size}")
    if not sigma > 0:
        raise ValueError(f"blur sigma must be > 0, got {sigma}")
    half = (kernel_size - 1) * 0.5
    x = torch.linspace(-half, half, steps=kernel_size, dtype=torch.float32, device=device)
    pdf = torch.exp(-0.5 * (x / sigma).pow(2))
    return pdf / pdf.sum()


def check_blur_fits(kernel_size: int, grid: tuple[int, ...]) -> None:
    """Reflect padding needs ``ks // 2`` smaller than every grid side."""
    pad = kernel_size // 2
    if pad and min(grid) <= pad:
        raise ValueError(
            f"blur kernel_size {kernel_size} is too large for a feature grid of {tuple(grid)}: "
            f"reflect padding needs kernel_size // 2 < {min(grid)}"
        )


def _reflect_index(size: int, pad: int, device: torch.device) -> torch.Tensor:
    """Source position of each of the ``size + 2·pad`` reflect-padded positions."""
    i = torch.arange(-pad, size + pad, device=device).abs()
    return torch.where(i >= size, 2 * (size - 1) - i, i)


def _blur_axis(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Reflect-pad and correlate the last axis of ``x [..., n]`` with ``kernel [ks]``, tap by tap in the
    kernels' order and rounding (the module docstring)."""
    n, ks = x.shape[-1], kernel.numel()
    padded = x.index_select(-1, _reflect_index(n, ks // 2, x.device))
    out = torch.zeros_like(x)
    for t in range(ks):
        out = out + kernel[t] * padded[..., t : t + n]
    return out


def _blur_axis_adjoint(g: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Transpose of :func:`_blur_axis` applied to ``g [..., n]``."""
    n, ks = g.shape[-1], kernel.numel()
    pad = ks // 2
    spread = torch.zeros(*g.shape[:-1], n + 2 * pad, dtype=g.dtype, device=g.device)
    for t in range(ks):
        spread[..., t : t + n] += kernel[t] * g
    out = torch.zeros_like(g)
    return out.index_add_(-1, _reflect_index(n, pad, g.device), spread)


def blur_reference(rows: torch.Tensor, kernel: torch.Tensor, grid: tuple[int, int] | None) -> torch.Tensor:
    """Blur ``rows [N, d]`` with the 1-D ``kernel [ks]`` on a 2-D ``grid`` or along ``d``."""
    kernel = kernel.to(rows.dtype)
    if grid is None:
        return _blur_axis(rows, kernel)
    n, d = rows.shape
    h, w = grid
    x = _blur_axis(rows.reshape(n, h, w), kernel)
    x = _blur_axis(x.transpose(1, 2), kernel).transpose(1, 2)
    return x.reshape(n, d)


def blur_adjoint_reference(grad: torch.Tensor, kernel: torch.Tensor, grid: tuple[int, int] | None) -> torch.Tensor:
    """The transpose of :func:`blur_reference` applied to ``grad [N, d]`` (it is linear)."""
    kernel = kernel.to(grad.dtype)
    if grid is None:
        return _blur_axis_adjoint(grad, kernel)
    n, d = grad.shape
    h, w = grid
    g = _blur_axis_adjoint(grad.reshape(n, h, w).transpose(1, 2), kernel).transpose(1, 2)
    return _blur_axis_adjoint(g, kernel).reshape(n, d)
