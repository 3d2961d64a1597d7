"""Plain-PyTorch twins of every kernel: the CPU engine runs these, and kernel tests compare to them.

KV cache layout (shared with the Triton kernels): one tensor per layer for K and one for V,
each ``[num_blocks, block_size, num_kv_heads, head_dim]``; token ``t`` of a request lives at
slot ``block_tables[b, t // block_size] * block_size + t % block_size``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention.metadata import AttentionMetadata


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf.to(dtype) if dtype != torch.float32 else xf) * weight


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x`` then normalise it; returns (normed, new residual)."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for the fused gate/up projection."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding (rotate the two halves), as HF Llama does.

    q: [T, Hq, D], k: [T, Hkv, D], positions: [T], cos_sin_cache: [max_pos, D] holding
    cos in the first D/2 columns and sin in the last D/2.
    """
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each new token's K and V into its cache slot; slots < 0 (padding) are skipped."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k[keep].to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v[keep].to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of the new tokens over each request's paged context.

    Covers prefill, chunked prefill on top of a cached prefix, and decode in one op: the
    queries and contexts are padded to a rectangle and masked. q: [T, Hq, D] -> [T, Hq, D].
    """
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    gather = _context_gather(md, q.device)
    k = k_cache.view(-1, num_kv_heads, head_dim)[gather.slots]  # [B, S, Hkv, D]
    v = v_cache.view(-1, num_kv_heads, head_dim)[gather.slots]
    # Slots past a request's length hold anything (NaN included); 0 * NaN would poison P @ V.
    k = k.masked_fill(~gather.valid[:, :, None, None], 0.0).to(q.dtype)
    v = v.masked_fill(~gather.valid[:, :, None, None], 0.0).to(q.dtype)
    qp = q.new_zeros(gather.batch, gather.max_q, num_heads, head_dim)
    qp[gather.q_rows_b, gather.q_rows_i] = q
    out = F.scaled_dot_product_attention(
        qp.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=gather.mask[:, None],
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return out.transpose(1, 2)[gather.q_rows_b, gather.q_rows_i]


class _ContextGather:
    """Index tensors shared by every layer of one step (built once, cached in md.scratch)."""

    def __init__(self, md: AttentionMetadata, device: torch.device) -> None:
        qsl = md.query_start_loc.to(device=device, dtype=torch.long)
        seq_lens = md.seq_lens.to(device=device, dtype=torch.long)
        q_lens = qsl[1:] - qsl[:-1]
        self.batch = int(seq_lens.shape[0])
        self.max_q = int(md.max_query_len)
        pos = torch.arange(md.max_seq_len, device=device)
        tables = md.block_tables.to(device=device, dtype=torch.long)
        block_idx = (pos // md.block_size).clamp(max=tables.shape[1] - 1)
        self.slots = tables[:, block_idx] * md.block_size + pos % md.block_size  # [B, S]
        self.valid = pos[None, :] < seq_lens[:, None]
        q_pos = (seq_lens - q_lens)[:, None] + torch.arange(self.max_q, device=device)  # [B, Q]
        self.mask = self.valid[:, None, :] & (pos[None, None, :] <= q_pos[:, :, None])
        token_b = torch.repeat_interleave(torch.arange(self.batch, device=device), q_lens)
        self.q_rows_b = token_b
        self.q_rows_i = torch.arange(int(qsl[-1]), device=device) - qsl[token_b]


def _context_gather(md: AttentionMetadata, device: torch.device) -> _ContextGather:
    gather = md.scratch.get("reference_gather")
    if gather is None:
        gather = md.scratch["reference_gather"] = _ContextGather(md, device)
    assert isinstance(gather, _ContextGather)
    return gather
