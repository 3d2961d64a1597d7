"""Rotary position embedding tables (plain and llama3-scaled), applied through the kernels."""

from __future__ import annotations

import math

import torch
from torch import nn

from tessel.config.model_arch import RopeScaling
from tessel.kernels import dispatch


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse frequencies computed exactly as transformers does, so positions agree bit for bit."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None or scaling.rope_type == "default":
        return inv_freq
    if scaling.rope_type != "llama3":
        raise ValueError(f"unsupported rope_scaling type {scaling.rope_type!r}")
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    cos_sin_cache: torch.Tensor

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling | None
    ) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        # One row per position: cos | sin halves; kept in fp32 whatever the model dtype.
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), -1), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return dispatch.apply_rope(q, k, positions, self.cos_sin_cache)

    def apply_and_store(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k, and write the rotated k and v into their cache slots (one launch on CUDA)."""
        return dispatch.apply_rope_and_store_kv(q, k, v, positions, self.cos_sin_cache, kv_cache, slot_mapping)
