"""SiLU-and-mul for the fused gate/up projection: ``silu(x[..., :d]) * x[..., d:]``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels import pdl
from tessel.kernels.checks import FLOAT_DTYPES, check_tensor


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, d, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # see kernels/pdl.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + offs, mask=mask, other=0.0)
    silu = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty)  # rounded like F.silu
    tl.store(out_ptr + row * stride_o + offs, (silu.to(tl.float32) * up.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be even (gate | up), got {x.shape[-1]}")
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    out = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(d))
    if x2.shape[0]:
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](
            x2, out, x2.stride(0), out.stride(0), d, BLOCK=block, **pdl.launch_options(x2)
        )
    return out.view(*x.shape[:-1], d)
