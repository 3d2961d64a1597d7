"""The one place the engine gets its ops from: Triton kernels on CUDA, the CPU engine's fast paths
(C kernels for fp32, falling back to the references themselves) on the CPU, references elsewhere."""

from __future__ import annotations

import os
from functools import cache
from types import ModuleType

import torch
import torch.nn.functional as F

from tessel.kernels import cpu_argmax, cpu_attention, cpu_elementwise, cpu_linear, reference
from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.moe import reference as moe_reference
from tessel.kernels.quant import reference as quant_reference
from tessel.kernels.quant.types import QuantizedTensor
from tessel.kernels.sampling_types import TemperatureDraws


@cache
def _triton_ops() -> ModuleType | None:
    """The Triton kernels, imported on first CUDA use (a CPU process never loads Triton)."""
    try:
        from tessel.kernels import triton_ops
    except ImportError:  # Triton is a Linux-only dependency
        return None
    return triton_ops


def _use_triton(t: torch.Tensor) -> bool:
    if not t.is_cuda or os.environ.get("TESSEL_KERNELS", "triton") == "reference":
        return False
    return _triton_ops() is not None


def _ops() -> ModuleType:
    ops = _triton_ops()
    assert ops is not None  # only called after _use_triton said yes
    return ops


def _use_cpu_fast_path(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and os.environ.get("TESSEL_KERNELS", "") != "reference"


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight^T + bias``; ``packed`` is the weight in oneDNN's layout (CPU only). On CUDA,
    cuBLAS except for decode-sized calls on weights kernels/gemv.py has tiles for."""
    if packed is not None and _use_cpu_fast_path(x):
        return cpu_linear.linear(x, packed, weight, bias)
    if _use_triton(x):
        config = _ops().gemv_config(x, weight, bias)
        if config is not None:
            return _ops().gemv(x, weight, config)
    return F.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _use_triton(x):
        return _ops().rms_norm(x, weight, eps)
    if _use_cpu_fast_path(x):
        return cpu_elementwise.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if _use_triton(x):
        return _ops().fused_add_rms_norm(x, residual, weight, eps)
    if _use_cpu_fast_path(x):
        return cpu_elementwise.fused_add_rms_norm(x, residual, weight, eps)
    return reference.fused_add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if _use_triton(x):
        return _ops().silu_and_mul(x)
    if _use_cpu_fast_path(x):
        return cpu_elementwise.silu_and_mul(x)
    return reference.silu_and_mul(x)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if _use_triton(q):
        return _ops().apply_rope(q, k, positions, cos_sin_cache)
    if _use_cpu_fast_path(q):
        return cpu_elementwise.apply_rope(q, k, positions, cos_sin_cache)
    return reference.apply_rope(q, k, positions, cos_sin_cache)


def apply_rope_and_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rope`` then ``store_kv`` of the rotated k and of v; one launch on CUDA."""
    if _use_triton(q):
        return _ops().apply_rope_and_store_kv(q, k, v, positions, cos_sin_cache, kv_cache, slot_mapping)
    q, k = apply_rope(q, k, positions, cos_sin_cache)
    store_kv(k, v, *kv_cache, slot_mapping)
    return q, k


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if _use_triton(k_cache):
        _ops().store_kv(k, v, k_cache, v_cache, slot_mapping)
    else:
        reference.store_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
) -> torch.Tensor:
    """``k_new``/``v_new``: this step's K/V, already in the cache; the CPU path reads them
    instead of the cache for prompt chunks with no cached prefix."""
    if _use_triton(q):
        return _ops().paged_attention(q, k_cache, v_cache, md, scale)
    if _use_cpu_fast_path(q):
        return cpu_attention.paged_attention(q, k_cache, v_cache, md, scale, k_new, v_new)
    return reference.paged_attention(q, k_cache, v_cache, md, scale)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """int64 [B]: each row's first index of its maximum, for ``x`` [B, V]."""
    if _use_cpu_fast_path(x) and x.dim() == 2 and x.dtype in (torch.float32, torch.float64):
        return cpu_argmax.argmax_rows(x)
    return x.argmax(dim=-1)


def sample_tokens(
    logits: torch.Tensor, draws: TemperatureDraws | None = None
) -> torch.Tensor:
    """Greedy / temperature sampling in one read of the logits (Gumbel-max keyed by seed and step)."""
    if _use_triton(logits):
        return _ops().sample_tokens(logits, draws)
    return reference.sample_tokens(logits, draws)


def quantize_rows(x: torch.Tensor, qdtype: torch.dtype) -> QuantizedTensor:
    """Per-token symmetric int8/fp8 quantization of activations."""
    if _use_triton(x):
        return _ops().quantize_rows(x, qdtype)
    return quant_reference.quantize_rows(x, qdtype)


def rms_norm_quant(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, qdtype: torch.dtype
) -> tuple[QuantizedTensor, torch.Tensor]:
    """RMSNorm (after the residual add, when given) quantized per token; (quantized, residual)."""
    if _use_triton(x):
        return _ops().rms_norm_quant(x, residual, weight, eps, qdtype)
    return quant_reference.rms_norm_quant(x, residual, weight, eps, qdtype)


def silu_and_mul_quant(x: torch.Tensor, qdtype: torch.dtype) -> QuantizedTensor:
    if _use_triton(x):
        return _ops().silu_and_mul_quant(x, qdtype)
    return quant_reference.silu_and_mul_quant(x, qdtype)


def scaled_mm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``(a @ b.T) * a_scale * b_scale + bias`` for int8 or fp8 ``a``/``b``, in ``out_dtype``."""
    if _use_triton(a):
        return _ops().scaled_mm(a, a_scale, b, b_scale, bias, out_dtype)
    return quant_reference.scaled_mm(a, a_scale, b, b_scale, bias, out_dtype)


def fused_moe(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """Routed SwiGLU experts: x [T, H], w13 [E, 2I, H], w2 [E, H, I], top-k weights/ids [T, K]."""
    if _use_triton(x):
        return _ops().fused_moe(x, w13, w2, topk_weights, topk_ids)
    return moe_reference.fused_moe(x, w13, w2, topk_weights, topk_ids)
