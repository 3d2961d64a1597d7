"""The one place the engine gets its ops from: Triton kernels on CUDA, references elsewhere."""

from __future__ import annotations

import torch

from kernels import reference
from kernels.attention.metadata import AttentionMetadata


def _use_triton(t: torch.Tensor) -> bool:
    # Filled in by the Triton kernels; until a kernel exists for an op it runs its reference.
    return False


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return reference.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return reference.fused_add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return reference.silu_and_mul(x)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return reference.apply_rope(q, k, positions, cos_sin_cache)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    reference.store_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    return reference.paged_attention(q, k_cache, v_cache, md, scale)
