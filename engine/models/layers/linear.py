"""Linear layers that know how a checkpoint's full weight maps onto their shard.

Each parameter carries a ``weight_loader(param, full_weight, shard_id)``: the loader hands
it the checkpoint tensor and the layer copies in the rows (column-parallel) or columns
(row-parallel) this rank owns. Fused layers (QKV, gate/up) take several checkpoint tensors,
each placed by ``shard_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers.parallel import SINGLE, ParallelRank
from kernels import cpu_linear, dispatch

WeightLoader = Callable[[nn.Parameter, torch.Tensor, "str | None"], None]


def _param(shape: Sequence[int], loader: WeightLoader) -> nn.Parameter:
    p = nn.Parameter(torch.empty(*shape), requires_grad=False)
    p.weight_loader = loader  # type: ignore[attr-defined]
    return p


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's output rows split across ranks; outputs stay sharded."""

    def __init__(
        self,
        in_features: int,
        out_sizes: Sequence[int],
        bias: bool = False,
        tp: ParallelRank = SINGLE,
        shard_ids: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.local_sizes = [tp.shard(n, "output features") for n in out_sizes]
        self.shard_ids = list(shard_ids) if shard_ids else [""]
        self.weight = _param((sum(self.local_sizes), in_features), self._load)
        self.bias = _param((sum(self.local_sizes),), self._load) if bias else None
        self.packed: torch.Tensor | None = None  # CPU: ``weight`` packed for oneDNN (pack_cpu_weights)

    def _load(self, param: nn.Parameter, full: torch.Tensor, shard_id: str | None) -> None:
        index = self.shard_ids.index(shard_id or "")
        size = self.local_sizes[index]
        offset = sum(self.local_sizes[:index])
        rows = full.narrow(0, self.tp.rank * size, size)
        param.data.narrow(0, offset, size).copy_(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch.linear(x, self.weight, self.bias, self.packed)


class RowParallelLinear(nn.Module):
    """y = x W^T with W's input columns split across ranks; partial sums need an all-reduce
    (a no-op at one rank)."""

    def __init__(self, in_features: int, out_features: int, tp: ParallelRank = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.local_in = tp.shard(in_features, "input features")
        self.weight = _param((out_features, self.local_in), self._load)
        self.packed: torch.Tensor | None = None  # CPU: ``weight`` packed for oneDNN (pack_cpu_weights)

    def _load(self, param: nn.Parameter, full: torch.Tensor, shard_id: str | None) -> None:
        param.data.copy_(full.narrow(1, self.tp.rank * self.local_in, self.local_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch.linear(x, self.weight, None, self.packed)


class VocabParallelEmbedding(nn.Module):
    """Token embedding, its vocabulary rows split across ranks."""

    def __init__(self, vocab_size: int, dim: int, tp: ParallelRank = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.local_vocab = tp.shard(vocab_size, "vocab_size")
        self.weight = _param((self.local_vocab, dim), self._load)
        self.packed: torch.Tensor | None = None  # CPU, as the LM head: ``weight`` packed for oneDNN

    def _load(self, param: nn.Parameter, full: torch.Tensor, shard_id: str | None) -> None:
        param.data.copy_(full.narrow(0, self.tp.rank * self.local_vocab, self.local_vocab))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)

    def as_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over this rank's vocabulary rows: the weight used as the LM head."""
        return dispatch.linear(hidden, self.weight, None, self.packed)


def pack_cpu_weights(modules: list[nn.Module]) -> int:
    """Pack the weight of every linear layer under ``modules`` (and of those modules
    themselves, e.g. an LM head) for oneDNN, after loading; returns how many were packed.
    The weights must not change afterwards. A no-op off the CPU or outside fp32."""
    count = 0
    for root in modules:
        for m in root.modules():
            is_head = m is root and isinstance(m, VocabParallelEmbedding)
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) or is_head:
                m.packed = cpu_linear.pack(m.weight)
                count += m.packed is not None
    return count


def default_weight_loader(param: nn.Parameter, full: torch.Tensor, shard_id: str | None) -> None:
    param.data.copy_(full)
