"""A sparse mixture-of-experts block: router, top-k, routed SwiGLU experts.

Expert weights are stacked, gate/up as ``w13 [E, 2I, H]`` and down as ``w2 [E, H, I]``, so one
grouped GEMM covers every expert and tensor parallelism shards ``I`` in each expert's slice
(the column/row-parallel split of a dense MLP, applied per expert).
"""

from __future__ import annotations

import torch
from torch import nn

from tessel.engine.models.layers.collectives import all_reduce
from tessel.engine.models.layers.linear import TensorSource, make_param, read_whole
from tessel.engine.models.layers.parallel import SINGLE, ParallelRank
from tessel.kernels import dispatch
from tessel.kernels.moe.reference import route_topk

_W13_SHARDS = ("gate", "up")


class FusedMoE(nn.Module):
    """``num_experts`` SwiGLU experts of width ``intermediate_size``, each token sent to ``top_k``."""

    expert_load: torch.Tensor  # a buffer, registered in __init__

    def __init__(
        self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
        renormalise: bool, tp: ParallelRank = SINGLE,
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be in 1..num_experts={num_experts}")
        self.tp, self.num_experts, self.top_k, self.renormalise = tp, num_experts, top_k, renormalise
        self.local_inter = tp.shard(intermediate_size, "moe_intermediate_size")
        # the router is small and every rank needs all of its logits: replicated
        self.gate = make_param((num_experts, hidden_size), _load_replicated)
        self.w13 = make_param((num_experts, 2 * self.local_inter, hidden_size), self._load_w13)
        self.w2 = make_param((num_experts, hidden_size, self.local_inter), self._load_w2)
        # tokens routed to each expert since the runner last read it: accumulated on the device
        # (no host sync per layer; a fixed address, so CUDA graphs capture the update too)
        self.register_buffer("expert_load", torch.zeros(num_experts, dtype=torch.long), persistent=False)

    def _load_w13(self, param: nn.Parameter, full: TensorSource, shard_id: str | None) -> None:
        """``shard_id`` is ``"{expert}:gate"`` or ``"{expert}:up"``; ``full`` is that [I, H] matrix."""
        expert, part = _parse(shard_id)
        n = self.local_inter
        rows = full.narrow(0, self.tp.rank * n, n)
        param.data[expert].narrow(0, _W13_SHARDS.index(part) * n, n).copy_(rows)

    def _load_w2(self, param: nn.Parameter, full: TensorSource, shard_id: str | None) -> None:
        expert, _ = _parse(shard_id)
        n = self.local_inter
        param.data[expert].copy_(full.narrow(1, self.tp.rank * n, n))

    def expert_counts(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Tokens routed to each expert this step: the load-balance signal."""
        return torch.bincount(topk_ids.reshape(-1), minlength=self.num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = dispatch.linear(x, self.gate)
        weights, ids = route_topk(logits, self.top_k, self.renormalise)
        flat = ids.reshape(-1)
        # index_add_, not bincount: CUDA's bincount reads the max id on the host (a sync)
        self.expert_load.index_add_(0, flat, torch.ones_like(flat))
        out = dispatch.fused_moe(x, self.w13, self.w2, weights, ids)
        # each rank holds a slice of every expert's width: partial sums, as after a row-parallel
        # down projection (every rank routed the same way: the router is replicated)
        return all_reduce(out) if self.tp.size > 1 else out


def _parse(shard_id: str | None) -> tuple[int, str]:
    if shard_id is None or ":" not in shard_id:
        raise ValueError(f"expert weight loaded without an 'expert:part' shard id ({shard_id!r})")
    expert, part = shard_id.split(":")
    return int(expert), part


def _load_replicated(param: nn.Parameter, full: TensorSource, shard_id: str | None) -> None:
    param.data.copy_(read_whole(full))
