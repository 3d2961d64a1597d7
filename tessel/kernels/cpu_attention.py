"""Paged attention for the CPU engine: ``reference.paged_attention``'s function, built for speed.

The reference gathers every context token one by one; here each request's context is gathered a
whole block at a time (``index_select`` over the block axis, a memcpy per block), decode rows
attend with the query heads of one KV head stacked as the query axis (each K/V row is read
once per KV head, not once per query head), and a prompt chunk with no cached prefix attends
over the K/V it just computed instead of reading them back from the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tessel.kernels import cpu_native
from tessel.kernels.attention.metadata import AttentionMetadata

_MAX_DECODE_GROUPS = 4
_MIN_GROUP_ROWS = 16


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D] -> [T, Hq, D]; ``k_new``/``v_new`` ([T, Hkv, D]) are this step's K/V,
    already stored in the cache, passed so prompt chunks without a prefix need not re-read it."""
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    plan = _cpu_plan(md, q.device)
    q = q.contiguous()  # the C kernel reads q's rows in place
    out = torch.empty_like(q)
    if plan.decode_rows is not None and _native_fits(q, k_cache):
        cpu_native.paged_decode(q, k_cache, v_cache, plan.decode_tables, plan.decode_lens, scale,
                                rows=plan.decode_rows, out=out)
    else:
        for group in plan.decode:
            out[group.rows] = _decode(q[group.rows], k_cache, v_cache, group, scale)
    gqa = num_heads != num_kv_heads
    # an E4M3 cache is read even for a whole prompt, so that its tokens see what decode will see
    exact_cache = k_cache.dtype == q.dtype
    for chunk in plan.prefill:
        if chunk.mask is None and k_new is not None and v_new is not None and exact_cache:
            k, v = k_new[chunk.rows], v_new[chunk.rows]
        else:
            k = _gather_context(k_cache, chunk.blocks, chunk.seq_len)
            v = _gather_context(v_cache, chunk.blocks, chunk.seq_len)
        o = F.scaled_dot_product_attention(
            q[chunk.rows].transpose(0, 1).unsqueeze(0),
            k.to(q.dtype).transpose(0, 1).unsqueeze(0),
            v.to(q.dtype).transpose(0, 1).unsqueeze(0),
            attn_mask=chunk.mask, is_causal=chunk.mask is None, scale=scale, enable_gqa=gqa,
        )
        out[chunk.rows] = o.squeeze(0).transpose(0, 1)
    return out


def _native_fits(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    num_heads, head_dim = q.shape[1:]
    _, block_size, num_kv_heads, _ = k_cache.shape
    return (
        q.dtype == k_cache.dtype == torch.float32
        and k_cache.is_contiguous()
        and num_heads <= 64 and head_dim <= 256 and block_size <= 256  # cpu_decode.c's MAX_*
        and cpu_native.decode_kernel() is not None
    )


def _gather_context(cache: torch.Tensor, blocks: torch.Tensor, seq_len: int) -> torch.Tensor:
    num_kv_heads, head_dim = cache.shape[2:]
    return cache.index_select(0, blocks).view(-1, num_kv_heads, head_dim)[:seq_len]


def _decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, d: _DecodeRows, scale: float
) -> torch.Tensor:
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    width = d.mask.shape[-1]
    # .to: an E4M3 cache is read back in q's dtype (a no-op for a cache in q's dtype)
    k = k_cache.index_select(0, d.blocks).view(batch * width, num_kv_heads, head_dim).to(q.dtype)
    v = v_cache.index_select(0, d.blocks).view(batch * width, num_kv_heads, head_dim).to(q.dtype)
    # Past a request's length the gathered rows hold whatever the cache held (stale tokens, or
    # NaN in the tests). The mask gives them weight 0, but 0 * NaN is NaN: zero them first.
    k.index_fill_(0, d.padding, 0.0)
    v.index_fill_(0, d.padding, 0.0)
    k = k.view(batch, width, num_kv_heads, head_dim).transpose(1, 2)
    v = v.view(batch, width, num_kv_heads, head_dim).transpose(1, 2)
    grouped = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    o = F.scaled_dot_product_attention(grouped, k, v, attn_mask=d.mask, scale=scale)
    return o.reshape(batch, num_heads, head_dim)


class _DecodeRows:
    """Decode rows of similar lengths, attended as one batch padded to the longest."""

    def __init__(self, rows: list[int], lens: list[int], tables: torch.Tensor, block_size: int) -> None:
        device = tables.device
        num_blocks = -(-max(lens) // block_size)
        width = num_blocks * block_size
        self.rows = torch.tensor(rows, device=device)  # query row of each decode request
        self.blocks = tables[:, :num_blocks].reshape(-1)  # [B * num_blocks] physical blocks
        lens_t = torch.tensor(lens, device=device)
        pos = torch.arange(width, device=device)
        valid = pos[None, :] < lens_t[:, None]
        self.mask = valid[:, None, None, :]  # [B, 1, 1, width]
        self.padding = (~valid).reshape(-1).nonzero().squeeze(1)  # gathered rows to zero


class _PrefillChunk:
    def __init__(self, rows: slice, seq_len: int, blocks: torch.Tensor, mask: torch.Tensor | None) -> None:
        self.rows = rows  # the chunk's query rows
        self.seq_len = seq_len  # context length after this chunk
        self.blocks = blocks  # the context's physical blocks
        # [Q, S] causal mask offset by the cached prefix; None: no prefix, plain causal (and the
        # context is exactly this step's new K/V)
        self.mask = mask


class _CpuPlan:
    """Index tensors shared by every layer of one step (built once, cached in md.scratch)."""

    def __init__(self, md: AttentionMetadata, device: torch.device) -> None:
        qsl = md.query_start_loc.tolist()
        seq_lens = (md.seq_lens_cpu if md.seq_lens_cpu is not None else md.seq_lens).tolist()
        tables = md.block_tables.to(device=device, dtype=torch.long)
        bs = md.block_size
        decode = sorted((b for b in range(len(seq_lens)) if qsl[b + 1] - qsl[b] == 1), key=seq_lens.__getitem__)
        # The C kernel reads the cache and q/out in place, in one call for every decode row,
        # longest first: its threads take requests as they free up, so the short ones fill the end.
        longest_first = decode[::-1]
        self.decode_rows = torch.tensor([qsl[b] for b in longest_first], dtype=torch.long) if decode else None
        self.decode_tables = tables[longest_first].contiguous()
        self.decode_lens = torch.tensor([seq_lens[b] for b in longest_first], dtype=torch.long)
        # The torch path pads; groups of similar lengths pad less.
        self.decode = [
            _DecodeRows([qsl[b] for b in group], [seq_lens[b] for b in group], tables[group], bs)
            for group in _length_groups(decode)
        ]
        self.prefill: list[_PrefillChunk] = []
        for b in range(len(seq_lens)):
            q_len, s_len = qsl[b + 1] - qsl[b], seq_lens[b]
            if q_len == 1:
                continue
            blocks = tables[b, : -(-s_len // bs)]
            mask = None
            if s_len != q_len:
                pos = torch.arange(s_len, device=device)
                q_pos = torch.arange(s_len - q_len, s_len, device=device)
                mask = pos[None, :] <= q_pos[:, None]
            self.prefill.append(_PrefillChunk(slice(qsl[b], qsl[b + 1]), s_len, blocks, mask))


def _length_groups(by_length: list[int]) -> list[list[int]]:
    """Cut requests sorted by length into a few equal-count groups, each padded only to its
    own longest: padding to the batch's longest would read about twice the KV on a mix of
    lengths, and each group costs one more attention call, so groups keep at least 16 rows."""
    count = min(_MAX_DECODE_GROUPS, max(1, len(by_length) // _MIN_GROUP_ROWS))
    size = -(-len(by_length) // count) if by_length else 1
    return [by_length[i : i + size] for i in range(0, len(by_length), size)]


def _cpu_plan(md: AttentionMetadata, device: torch.device) -> _CpuPlan:
    plan = md.scratch.get("cpu_plan")
    if plan is None:
        plan = md.scratch["cpu_plan"] = _CpuPlan(md, device)
    assert isinstance(plan, _CpuPlan)
    return plan
