"""Per-token activation quantization, alone or fused with the op before it (RMSNorm with its
residual add, or SiLU-and-mul), so the unquantized activations never go back to memory.

One program per token row holding the whole row in registers: the row's max |x| is needed
before any element can be quantized. The fused ops round to the activation dtype where the
unfused op would store it, so fused and unfused results agree.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels import pdl
from tessel.kernels.checks import FLOAT_DTYPES, check_shape, check_tensor
from tessel.kernels.quant.types import MIN_ABSMAX, QuantizedTensor, qmax

_MIN_ABSMAX = tl.constexpr(MIN_ABSMAX)


@triton.jit
def _round_half_even(x):
    # 1.5 * 2^23: adding then subtracting it rounds any |x| < 2^22 to an integer, ties to even,
    # in plain fp32 (libdevice.rint has no implementation in the interpreter).
    return (x + 12582912.0) - 12582912.0


@triton.jit
def _quantize_store(y, mask, q_ptrs, scale_ptr, QMAX: tl.constexpr, IS_INT: tl.constexpr):
    """Quantize one fp32 row ``y`` (masked lanes ignored) and store it with its scale."""
    absmax = tl.maximum(tl.max(tl.where(mask, tl.abs(y), 0.0), 0), _MIN_ABSMAX)
    tl.store(scale_ptr, tl.math.div_rn(absmax, QMAX))
    q = y * tl.math.div_rn(QMAX, absmax)
    if IS_INT:
        q = _round_half_even(q)
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    tl.store(q_ptrs, q.to(q_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _quant_kernel(
    x_ptr, q_ptr, s_ptr, stride_x, stride_q, K,
    QMAX: tl.constexpr, IS_INT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # see kernels/pdl.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    y = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    _quantize_store(y, mask, q_ptr + row * stride_q + offs, s_ptr + row, QMAX, IS_INT)


@triton.jit
def _rms_norm_quant_kernel(
    x_ptr, res_ptr, w_ptr, q_ptr, s_ptr, res_out_ptr,
    stride_x, stride_r, stride_q, stride_ro, K, eps,
    HAS_RESIDUAL: tl.constexpr, QMAX: tl.constexpr, IS_INT: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:  # see kernels/pdl.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = (x + tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / K + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # the same two roundings as kernels.norm: normalised x, then its product with the gain
    y = ((xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w).to(x_ptr.dtype.element_ty).to(tl.float32)
    _quantize_store(y, mask, q_ptr + row * stride_q + offs, s_ptr + row, QMAX, IS_INT)


@triton.jit
def _silu_and_mul_quant_kernel(
    x_ptr, q_ptr, s_ptr, stride_x, stride_q, d,
    QMAX: tl.constexpr, IS_INT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # see kernels/pdl.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)
    dt = x_ptr.dtype.element_ty
    y = ((gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32) * up).to(dt).to(tl.float32)  # as kernels.activation
    _quantize_store(y, mask, q_ptr + row * stride_q + offs, s_ptr + row, QMAX, IS_INT)


def _outputs(rows: int, k: int, qdtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    qmax(qdtype)  # names an unsupported dtype
    return (torch.empty(rows, k, dtype=qdtype, device=device),
            torch.empty(rows, 1, dtype=torch.float32, device=device))


def _meta(x: torch.Tensor, k: int, qdtype: torch.dtype) -> dict[str, object]:
    block = triton.next_power_of_2(k)
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    return {"QMAX": qmax(qdtype), "IS_INT": qdtype == torch.int8, "BLOCK": block, "num_warps": warps,
            **pdl.launch_options(x)}


def quantize_rows(x: torch.Tensor, qdtype: torch.dtype) -> QuantizedTensor:
    """Per-token symmetric quantization of ``x`` [..., K] (see kernels.quant.reference)."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    x2 = x.reshape(-1, x.shape[-1])
    q, s = _outputs(x2.shape[0], x2.shape[1], qdtype, x.device)
    if x2.shape[0]:
        _quant_kernel[(x2.shape[0],)](x2, q, s, x2.stride(0), q.stride(0), x2.shape[1], **_meta(x2, x2.shape[1], qdtype))
    return QuantizedTensor(q, s, x.dtype)


def rms_norm_quant(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, qdtype: torch.dtype
) -> tuple[QuantizedTensor, torch.Tensor]:
    """RMSNorm (after ``residual + x`` when given) quantized per token; returns (quantized, residual)."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=1, dtypes=(x.dtype,), device=x.device)
    k = x.shape[-1]
    check_shape("weight", weight, (k,))
    x2 = x.reshape(-1, k)
    res2 = res_out = x2
    if residual is not None:
        check_tensor("residual", residual, dtypes=(x.dtype,), device=x.device)
        check_shape("residual", residual, x.shape)
        res2, res_out = residual.reshape(-1, k), torch.empty_like(x2)
    q, s = _outputs(x2.shape[0], k, qdtype, x.device)
    if x2.shape[0]:
        _rms_norm_quant_kernel[(x2.shape[0],)](
            x2, res2, weight, q, s, res_out, x2.stride(0), res2.stride(0), q.stride(0), res_out.stride(0),
            k, eps, HAS_RESIDUAL=residual is not None, **_meta(x2, k, qdtype),
        )
    return QuantizedTensor(q, s, x.dtype), res_out.view(x.shape)


def silu_and_mul_quant(x: torch.Tensor, qdtype: torch.dtype) -> QuantizedTensor:
    """``silu(x[..., :d]) * x[..., d:]`` quantized per token."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be even (gate | up), got {x.shape[-1]}")
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    q, s = _outputs(x2.shape[0], d, qdtype, x.device)
    if x2.shape[0]:
        _silu_and_mul_quant_kernel[(x2.shape[0],)](x2, q, s, x2.stride(0), q.stride(0), d, **_meta(x2, d, qdtype))
    return QuantizedTensor(q, s, x.dtype)
