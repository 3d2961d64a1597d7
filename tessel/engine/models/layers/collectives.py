"""The collectives that join tensor-parallel shards, on the default torch.distributed group
(NCCL on CUDA, gloo on the CPU). Called only when ``tp.size > 1``: one rank does no such work."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tessel.engine.models.layers.parallel import ParallelRank


def all_reduce(x: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    """Sum ``x`` over the ranks, in place (row-parallel partial sums, vocab-parallel lookups);
    ``op=MAX`` for load-time statistics the ranks must agree on (quantization scales)."""
    dist.all_reduce(x, op=op)
    return x


def gather_columns(x: torch.Tensor, tp: ParallelRank, width: int) -> torch.Tensor | None:
    """Every rank's ``x`` [rows, cols] side by side on rank 0, cut to ``width`` columns
    (the vocabulary without its padding); None on the other ranks, which never sample."""
    x = x.contiguous()
    if tp.rank != 0:
        dist.gather(x, None, dst=0)
        return None
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.gather(x, parts, dst=0)
    return torch.cat(parts, dim=-1)[:, :width]
