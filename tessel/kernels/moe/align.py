"""Group the routed (token, expert) pairs into equal-size tiles of one expert each.

The fused-MoE kernels launch one program per BLOCK_M-row tile. Sorting the T*K pairs by expert
and padding each expert's segment to a multiple of BLOCK_M gives every tile rows of a single
expert, so a program multiplies them by one weight matrix. This is also the work balance: an
expert with no tokens gets no tile, and a hot expert (skewed routing) simply gets more tiles,
so every program does the same BLOCK_M x N x K of work no matter how routing falls
(vLLM's ``moe_align_block_size``, here in plain torch ops).

Everything stays on the device with no host sync: sizes are upper bounds known from the
shapes, and the kernels read the true tile count from ``num_tiles`` and exit past it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MoeTiles:
    """The tile schedule both fused-MoE kernels walk."""

    sorted_pairs: torch.Tensor  # [max_tiles * block_m] int32: flat pair t*K+k, grouped by expert;
    # padding rows hold the sentinel num_pairs
    tile_expert: torch.Tensor  # [max_tiles] int32: each tile's expert; -1 past num_tiles
    num_tiles: torch.Tensor  # [1] int32: tiles in use (the rest of the grid exits at once)
    num_pairs: int  # T * K, also the padding sentinel
    block_m: int  # rows per tile


def max_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Tiles needed in the worst case: every non-empty expert wastes up to block_m - 1 rows,
    and at most min(E, T*K) experts are non-empty."""
    busy = min(num_experts, num_pairs)
    return (num_pairs + busy * (block_m - 1)) // block_m


def align_pairs(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeTiles:
    """Sort the pairs of ``topk_ids`` [T, K] by expert, each expert padded to whole tiles."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    # scatter_add, not bincount: CUDA bincount reads the max id back to the host.
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    tiles_per = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles_per, 0)
    row_start = (tile_end - tiles_per) * block_m  # first padded row of each expert
    pair_start = torch.cumsum(counts, 0) - counts  # first sorted pair of each expert

    order = torch.argsort(flat, stable=True)  # pairs by expert, token order within one
    expert_of = flat[order]
    rank = torch.arange(n, device=device) - pair_start[expert_of]
    dest = row_start[expert_of] + rank

    total = max_tiles(n, num_experts, block_m)
    sorted_pairs = torch.full((total * block_m,), n, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    tiles = torch.arange(total, device=device)
    num_tiles = tile_end[-1:] if num_experts else torch.zeros(1, dtype=torch.long, device=device)
    tile_expert = torch.searchsorted(tile_end, tiles, right=True)
    tile_expert = torch.where(tiles < num_tiles, tile_expert, -1)
    return MoeTiles(
        sorted_pairs=sorted_pairs,
        tile_expert=tile_expert.to(torch.int32),
        num_tiles=num_tiles.to(torch.int32),
        num_pairs=n,
        block_m=block_m,
    )
