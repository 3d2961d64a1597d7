"""Every Triton op under the names ``dispatch`` uses (imported lazily, on first CUDA tensor)."""

from __future__ import annotations

import os

import torch

from tessel.kernels.activation import silu_and_mul
from tessel.kernels.attention import paged
from tessel.kernels.attention.decode import DecodeConfig
from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.gemv import config_for as gemv_config
from tessel.kernels.gemv import linear as gemv
from tessel.kernels.kv_store import store_kv
from tessel.kernels.moe.triton_moe import fused_moe
from tessel.kernels.norm import fused_add_rms_norm, rms_norm
from tessel.kernels.quant.act_quant import quantize_rows, rms_norm_quant, silu_and_mul_quant
from tessel.kernels.quant.gemm import scaled_mm
from tessel.kernels.rope import apply_rope, apply_rope_and_store_kv
from tessel.kernels.sampling import sample_tokens

__all__ = [
    "apply_rope", "apply_rope_and_store_kv", "fused_add_rms_norm", "fused_moe", "gemv", "gemv_config",
    "paged_attention", "quantize_rows",
    "rms_norm", "rms_norm_quant", "sample_tokens", "scaled_mm", "silu_and_mul", "silu_and_mul_quant", "store_kv",
]

# TESSEL_DECODE_SPLIT picks a comparison variant: balanced (default) | static | none.
DECODE_CONFIG = DecodeConfig(mode=os.environ.get("TESSEL_DECODE_SPLIT", "balanced"))  # type: ignore[arg-type]


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, md: AttentionMetadata, scale: float
) -> torch.Tensor:
    return paged.paged_attention(q, k_cache, v_cache, md, scale, DECODE_CONFIG)
