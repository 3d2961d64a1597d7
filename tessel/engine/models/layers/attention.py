"""Paged attention for one layer over a cache that already holds the new tokens' K/V
(``RotaryEmbedding.apply_and_store`` writes them, fused with the rotation)."""

from __future__ import annotations

import torch
from torch import nn

from tessel.kernels import dispatch
from tessel.kernels.attention.metadata import AttentionMetadata


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        md: AttentionMetadata,
    ) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] for the new tokens, already in ``kv_cache`` -> [T, Hq * D]."""
        k_cache, v_cache = kv_cache
        out = dispatch.paged_attention(q, k_cache, v_cache, md, self.scale, k, v)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
