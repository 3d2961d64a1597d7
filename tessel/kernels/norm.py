"""RMSNorm, plain and fused with the residual add: one program per token row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels import pdl
from tessel.kernels.checks import FLOAT_DTYPES, check_shape, check_tensor


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_r, stride_o, stride_ro, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # see kernels/pdl.py: wait for the previous kernel, let the next one launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # residual + x rounded to the activation dtype, as the reference does.
        x = (x + tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    y = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):  # type: ignore[no-untyped-def]
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
    hidden = x.shape[-1]
    check_shape("weight", weight, (hidden,))
    x2 = x.reshape(-1, hidden)
    out = torch.empty(x2.shape, dtype=torch.result_type(x, weight), device=x.device)
    res2 = res_out = x2
    if residual is not None:
        check_tensor("residual", residual, dtypes=(x.dtype,), device=x.device)
        check_shape("residual", residual, x.shape)
        res2 = residual.reshape(-1, hidden)
        res_out = torch.empty_like(x2)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, res2, weight, out, res_out,
            x2.stride(0), res2.stride(0), out.stride(0), res_out.stride(0), hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden),
            num_warps=4 if hidden <= 4096 else 8, **pdl.launch_options(x2),
        )
    return out.view(x.shape), res_out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual + x`` then its RMSNorm, in one pass; returns (normed, new residual)."""
    return _launch(x, residual, weight, eps)
