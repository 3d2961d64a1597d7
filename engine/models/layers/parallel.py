"""Tensor-parallel placement. One process, one rank today; the layers already shard by it,
so a torch.distributed group only has to set these numbers and add the all-reduces."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelRank:
    rank: int = 0
    size: int = 1

    def shard(self, total: int, what: str) -> int:
        """This rank's share of ``total`` items (heads, columns, vocab rows)."""
        if total % self.size:
            raise ValueError(f"{what}={total} is not divisible by tensor_parallel_size={self.size}")
        return total // self.size


SINGLE = ParallelRank()
