"""Tile sizes for the fused-MoE kernels, keyed by how many rows each expert gets on average.

BLOCK_M is fixed before launch (the tile schedule is built with it), so it is picked here from
the shapes alone, not autotuned. Few rows per expert (decode: T*K/E of 1 or less) is bound by
streaming each active expert's weights once: short tiles so padding wastes little, narrow N so
many programs share the weight read. Many rows per expert (prefill) is compute-bound: tall,
wide tiles for the tensor cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class MoeConfig:
    """One launch's tile shape; both kernels use it (BLOCK_N/BLOCK_K over their own N and K)."""

    block_m: int  # rows (pairs of one expert) per tile
    block_n: int  # output columns per program
    block_k: int  # reduction step
    num_warps: int
    num_stages: int


# (largest average rows per expert, config); the last entry covers everything above.
# Kernel 1's BLOCK_N columns read 2 * BLOCK_N rows of w13 (gate and up), so 32 here matches
# vLLM's 64 over the stacked 2I; at decode Qwen3-30B-A3B gets 8 tiles x 24 column blocks = 192 programs,
# more than H200's 132 SMs. Checked on the H200 with benchmarks/moe_layer.py --sweep (2026-12-03,
# Qwen3-30B-A3B's layer, graph replays): the first two entries were within 1% of the sweep's best
# at T = 16, 64 and 256; at T = 1024 (64 rows per expert) BLOCK_N 64 beat 128 by 5%.
_TABLE: tuple[tuple[int, MoeConfig], ...] = (
    (8, MoeConfig(16, 32, 128, 4, 4)),
    (32, MoeConfig(32, 64, 128, 4, 4)),
    (128, MoeConfig(64, 64, 64, 4, 3)),
    (1 << 62, MoeConfig(128, 128, 64, 8, 3)),
)
# The interpreter: the smallest tiles tl.dot takes, so tiny test shapes still span several
# tiles, ragged N edges and more than one K step.
INTERPRETER = MoeConfig(16, 16, 16, 1, 1)


def pick_config(num_pairs: int, num_experts: int) -> MoeConfig:
    """The table's entry for T*K/E rows per expert (the interpreter's fixed one under it)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return INTERPRETER
    per_expert = num_pairs / max(num_experts, 1)
    return next(cfg for limit, cfg in _TABLE if per_expert <= limit)
