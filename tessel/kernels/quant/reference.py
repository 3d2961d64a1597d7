"""Plain-PyTorch twins of the W8A8 kernels: the CPU engine runs these, kernel tests compare to them.

Quantization is symmetric and per row: ``scale = max|x| / qmax``, ``q = x * (qmax / max|x|)``
rounded to nearest-even (int8) or converted to E4M3 (fp8, also nearest-even), clamped to
``[-qmax, qmax]``. The kernels compute exactly these fp32 operations in this order.
"""

from __future__ import annotations

import torch

from tessel.kernels import reference
from tessel.kernels.quant.types import FP8_DTYPE, MIN_ABSMAX, QuantizedTensor, qmax

# Any 1024 products of int8 values (|a| <= 127 activations, |w| <= 128 weights) sum to less than
# 2^24 in magnitude (1024 * 127 * 128 = 16_646_144 < 16_777_216), so fp32 adds them exactly.
EXACT_FP32_K = 1024


def quantize_rows(x: torch.Tensor, qdtype: torch.dtype, absmax: torch.Tensor | None = None) -> QuantizedTensor:
    """``x`` [..., K] -> per-row quantized [rows, K] with scales [rows, 1]. ``absmax`` [rows, 1]:
    scale by these row maxima instead of ``x``'s own (a shard of longer rows, scaled as the whole)."""
    limit = qmax(qdtype)
    xf = x.reshape(-1, x.shape[-1]).float()
    if absmax is None:
        absmax = xf.abs().amax(dim=-1, keepdim=True)
    absmax = absmax.float().clamp(min=MIN_ABSMAX)
    q = xf * (limit / absmax)
    if qdtype == torch.int8:
        q = torch.round(q)
    data = q.clamp(-limit, limit).to(qdtype)
    return QuantizedTensor(data, absmax / limit, x.dtype)


def rms_norm_quant(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, qdtype: torch.dtype
) -> tuple[QuantizedTensor, torch.Tensor]:
    """(RMSNorm(x + residual) quantized per token, x + residual); no residual: x itself."""
    if residual is None:
        normed, residual = reference.rms_norm(x, weight, eps), x
    else:
        normed, residual = reference.fused_add_rms_norm(x, residual, weight, eps)
    return quantize_rows(normed, qdtype), residual


def silu_and_mul_quant(x: torch.Tensor, qdtype: torch.dtype) -> QuantizedTensor:
    """``silu(gate) * up`` quantized per token, for the down projection's input."""
    return quantize_rows(reference.silu_and_mul(x), qdtype)


def int8_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact ``a @ b.T`` in int32 for int8 ``a`` [M, K] and ``b`` [N, K].

    In fp32 over chunks of ``EXACT_FP32_K`` (each chunk's sum is exact, see above), the chunks
    summed in int32: on the CPU this is ~10x faster than ``torch._int_mm`` and bit-identical.
    """
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.int32, device=a.device)
    for k0 in range(0, a.shape[1], EXACT_FP32_K):
        chunk = a[:, k0 : k0 + EXACT_FP32_K].float() @ b[:, k0 : k0 + EXACT_FP32_K].float().T
        out += chunk.to(torch.int32)
    return out


def scaled_mm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``(a @ b.T) * a_scale * b_scale + bias`` cast to ``out_dtype``.

    a: [M, K] int8/fp8 (per-token scales ``a_scale``, M of them); b: [N, K] the same dtype
    (per-output-channel scales ``b_scale``, N of them). int8 accumulates exactly in int32,
    fp8 in fp32 (each product of two E4M3 values is exact in fp32).
    """
    if a.dtype == torch.int8:
        acc = int8_mm(a, b).float()
    elif a.dtype == FP8_DTYPE:
        acc = a.float() @ b.float().T
    else:
        raise ValueError(f"scaled_mm takes int8 or float8_e4m3fn inputs, got {a.dtype}")
    out = acc * a_scale.reshape(-1, 1).float() * b_scale.reshape(1, -1).float()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
