"""Random paged-cache batches for kernel tests: ragged lengths, shuffled blocks, NaN padding."""

from __future__ import annotations

import torch

from tessel.kernels.attention.metadata import AttentionMetadata


def make_batch(
    seq_lens: list[int],
    query_lens: list[int],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """q for the last ``query_lens[b]`` positions of each request; caches with NaN in unused slots."""
    g = torch.Generator().manual_seed(seed)
    blocks = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks) + 3  # spare blocks stay NaN
    perm = torch.randperm(num_blocks, generator=g)
    max_blocks = max(blocks)
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    used = 0
    for b, (s, nb) in enumerate(zip(seq_lens, blocks, strict=True)):
        ids = perm[used : used + nb]
        used += nb
        tables[b, :nb] = ids.to(torch.int32)
        for t in range(s):
            blk, off = ids[t // block_size], t % block_size
            k_cache[blk, off] = torch.randn(num_kv_heads, head_dim, generator=g).to(dtype)
            v_cache[blk, off] = torch.randn(num_kv_heads, head_dim, generator=g).to(dtype)
    qsl = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(qsl[-1]), num_q_heads, head_dim, generator=g).to(dtype)
    md = AttentionMetadata(
        slot_mapping=torch.full((int(qsl[-1]),), -1, dtype=torch.int64),
        query_start_loc=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_size=block_size,
    )
    if torch.device(device).type != "cpu":
        q, k_cache, v_cache = q.to(device), k_cache.to(device), v_cache.to(device)
        md.query_start_loc = md.query_start_loc.to(device)
        md.block_tables = md.block_tables.to(device)
        md.slot_mapping = md.slot_mapping.to(device)
        # seq_lens stays on the host too: the planner reads it there.
    return q, k_cache, v_cache, md
