"""Linear layers that know how a checkpoint's full weight maps onto their shard.

Each parameter carries a ``weight_loader(param, full_weight, shard_id)``: the loader hands
it the checkpoint tensor and the layer copies in the rows (column-parallel) or columns
(row-parallel) this rank owns. Fused layers (QKV, gate/up) take several checkpoint tensors,
each placed by ``shard_id``. Under tensor parallelism the full weight may be a lazy
safetensors slice (``TensorSource``) that reads only the rows or columns asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.layers.collectives import all_reduce
from engine.models.layers.parallel import SINGLE, ParallelRank


class TensorSource(Protocol):
    """A checkpoint tensor a rank reads only in part: a ``torch.Tensor``, or a lazy slice."""

    @property
    def shape(self) -> Sequence[int]: ...

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor: ...


WeightLoader = Callable[[nn.Parameter, TensorSource, "str | None"], None]


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
        partition: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        """``partition``: per output, (rows on this rank, first row in the full weight); by
        default an even split (the fused QKV passes its own when KV heads are replicated)."""
        super().__init__()
        self.tp = tp
        if partition is None:
            sizes = [tp.shard(n, "output features") for n in out_sizes]
            partition = [(size, tp.rank * size) for size in sizes]
        self.local_sizes = [size for size, _ in partition]
        self.source_starts = [start for _, start in partition]
        self.shard_ids = list(shard_ids) if shard_ids else [""]
        self.weight = _param((sum(self.local_sizes), in_features), self._load)
        self.bias = _param((sum(self.local_sizes),), self._load) if bias else None

    def _load(self, param: nn.Parameter, full: TensorSource, shard_id: str | None) -> None:
        index = self.shard_ids.index(shard_id or "")
        size = self.local_sizes[index]
        offset = sum(self.local_sizes[:index])
        rows = full.narrow(0, self.source_starts[index], size)
        param.data.narrow(0, offset, size).copy_(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x W^T with W's input columns split across ranks; partial sums need an all-reduce
    (a no-op at one rank)."""

    def __init__(self, in_features: int, out_features: int, tp: ParallelRank = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.local_in = tp.shard(in_features, "input features")
        self.weight = _param((out_features, self.local_in), self._load)

    def _load(self, param: nn.Parameter, full: TensorSource, shard_id: str | None) -> None:
        param.data.copy_(full.narrow(1, self.tp.rank * self.local_in, self.local_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return all_reduce(y) if self.tp.size > 1 else y


class VocabParallelEmbedding(nn.Module):
    """Token embedding (or LM head), its vocabulary rows split across ranks; the last rank's
    rows past the vocabulary are zeros, so any vocabulary size splits."""

    def __init__(self, vocab_size: int, dim: int, tp: ParallelRank = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.local_vocab, self.first_row = tp.vocab_rows(vocab_size)
        self.num_real_rows = max(0, min(self.local_vocab, vocab_size - self.first_row))
        self.weight = _param((self.local_vocab, dim), self._load)

    def _load(self, param: nn.Parameter, full: TensorSource, shard_id: str | None) -> None:
        real = self.num_real_rows
        if real:
            param.data[:real].copy_(full.narrow(0, self.first_row, real))
        param.data[real:].zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        # Each rank looks up the ids it owns, zeros for the others; the all-reduce fills them in.
        local = ids - self.first_row
        outside = (local < 0) | (local >= self.local_vocab)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill_(outside.unsqueeze(-1), 0.0))


def default_weight_loader(param: nn.Parameter, full: torch.Tensor, shard_id: str | None) -> None:
    param.data.copy_(full)
