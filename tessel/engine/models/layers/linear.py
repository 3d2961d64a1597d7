"""Linear layers that know how a checkpoint's full weight maps onto their shard.

Each parameter carries a ``weight_loader(param, full_weight, shard_id)``: the loader hands
it the checkpoint tensor and the layer copies in the rows (column-parallel) or columns
(row-parallel) this rank owns. Fused layers (QKV, gate/up) take several checkpoint tensors,
each placed by ``shard_id``. Under tensor parallelism the full weight may be a lazy
safetensors slice (``LazyTensor``) that reads only the rows or columns asked for.

Quantization and CPU packing act on the shard a rank holds, after loading: per output row a
column-parallel shard has whole rows; a row-parallel one agrees on each row's scale with the
other ranks (``W8A8LinearMethod``), so both match one rank's weights sliced.

How a layer stores its weight and computes ``x W^T`` is its ``LinearMethod`` (vLLM's hook):
unquantized by default; ``engine/models/layers/quantization`` supplies the W8A8 one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from tessel.engine.models.layers.collectives import all_reduce
from tessel.engine.models.layers.parallel import SINGLE, ParallelRank
from tessel.kernels import cpu_linear, dispatch
from tessel.kernels.quant.types import QuantizedTensor


class LazyTensor(Protocol):
    """A checkpoint tensor not yet read: a rank reads only the part it owns."""

    @property
    def shape(self) -> Sequence[int]: ...

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor: ...

    def read(self) -> torch.Tensor:
        """The whole tensor."""
        ...


TensorSource = torch.Tensor | LazyTensor
WeightLoader = Callable[[nn.Parameter, TensorSource, "str | None"], None]


def read_whole(src: TensorSource) -> torch.Tensor:
    """All of ``src``: what a replicated parameter (a norm gain, a per-channel scale) copies."""
    return src if isinstance(src, torch.Tensor) else src.read()


def make_param(
    shape: Sequence[int], loader: WeightLoader, dtype: torch.dtype | None = None, input_dim: int | None = None
) -> nn.Parameter:
    """A frozen parameter with its loader; ``input_dim``: the dim row-parallel layers shard
    (None: the parameter has no input dim, e.g. a per-output-channel scale, and is replicated)."""
    p = nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
    p.weight_loader = loader  # type: ignore[attr-defined]
    p.input_dim = input_dim  # type: ignore[attr-defined]
    return p


class LinearMethod:
    """How a linear layer holds its weight and computes ``x W^T + b``: unquantized here."""

    input_quant: torch.dtype | None = None
    """Dtype the layer wants its input quantized to (per token) by the op before it, if any."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, loader: WeightLoader) -> None:
        layer.weight = make_param((out_features, in_features), loader, input_dim=1)

    def apply(self, layer: nn.Module, x: Any, bias: torch.Tensor | None) -> torch.Tensor:
        # plain attributes: hot path; ``packed`` is the CPU's oneDNN layout (pack_cpu_weights)
        return dispatch.linear(x, layer.weight, bias, layer.packed)  # type: ignore[arg-type]

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once every checkpoint tensor is in (e.g. to quantize or repack)."""


UNQUANTIZED = LinearMethod()


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's output rows split across ranks; outputs stay sharded."""

    def __init__(
        self,
        in_features: int,
        out_sizes: Sequence[int],
        bias: bool = False,
        tp: ParallelRank = SINGLE,
        shard_ids: Sequence[str] | None = None,
        method: LinearMethod = UNQUANTIZED,
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
        self.in_features, self.out_features = in_features, sum(self.local_sizes)
        self.method = method
        method.create_weights(self, in_features, self.out_features, self._load)
        self.bias = make_param((self.out_features,), self._load) if bias else None
        self.packed: torch.Tensor | None = None  # CPU: ``weight`` packed for oneDNN (pack_cpu_weights)

    def _load(self, param: nn.Parameter, full: TensorSource, shard_id: str | None) -> None:
        index = self.shard_ids.index(shard_id or "")
        size = self.local_sizes[index]
        offset = sum(self.local_sizes[:index])
        rows = full.narrow(0, self.source_starts[index], size)
        param.data.narrow(0, offset, size).copy_(rows)

    @property
    def input_quant(self) -> torch.dtype | None:
        return self.method.input_quant

    def forward(self, x: Any) -> torch.Tensor:
        """``x``: activations, or a ``QuantizedTensor`` when ``input_quant`` asked for one."""
        return self.method.apply(self, x, self.bias)


class RowParallelLinear(nn.Module):
    """y = x W^T with W's input columns split across ranks; partial sums need an all-reduce
    (a no-op at one rank)."""

    def __init__(
        self, in_features: int, out_features: int, tp: ParallelRank = SINGLE, method: LinearMethod = UNQUANTIZED
    ) -> None:
        super().__init__()
        self.tp = tp
        self.local_in = tp.shard(in_features, "input features")
        self.in_features, self.out_features = self.local_in, out_features
        self.method = method
        method.create_weights(self, self.local_in, out_features, self._load)
        self.packed: torch.Tensor | None = None  # CPU: ``weight`` packed for oneDNN (pack_cpu_weights)

    def _load(self, param: nn.Parameter, full: TensorSource, shard_id: str | None) -> None:
        dim = getattr(param, "input_dim", None)
        if dim is None:  # e.g. a per-output-channel scale: every rank holds all of it
            param.data.copy_(read_whole(full))
        else:
            param.data.copy_(full.narrow(dim, self.tp.rank * self.local_in, self.local_in))

    @property
    def input_quant(self) -> torch.dtype | None:
        return self.method.input_quant

    def forward(self, x: Any) -> torch.Tensor:
        y = self.method.apply(self, x, None)
        return all_reduce(y) if self.tp.size > 1 else y


class VocabParallelEmbedding(nn.Module):
    """Token embedding (or LM head), its vocabulary rows split across ranks; the last rank's
    rows past the vocabulary are zeros, so any vocabulary size splits."""

    def __init__(self, vocab_size: int, dim: int, tp: ParallelRank = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.local_vocab, self.first_row = tp.vocab_rows(vocab_size)
        self.num_real_rows = max(0, min(self.local_vocab, vocab_size - self.first_row))
        self.weight = make_param((self.local_vocab, dim), self._load)
        self.packed: torch.Tensor | None = None  # CPU, as the LM head: ``weight`` packed for oneDNN
        self.head_quant: QuantizedTensor | None = None  # W8A8 LM head (ModelConfig.quantize_lm_head)

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

    def as_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over this rank's vocabulary rows (padding rows give 0): the weight used as
        the LM head; ``LlamaForCausalLM.compute_logits`` gathers them under tensor parallelism."""
        if self.head_quant is not None:
            w = self.head_quant
            x = dispatch.quantize_rows(hidden, w.data.dtype)
            return dispatch.scaled_mm(x.data, x.scale, w.data, w.scale, None, hidden.dtype)
        return dispatch.linear(hidden, self.weight, None, self.packed)


def pack_cpu_weights(modules: list[nn.Module]) -> int:
    """Pack the weight of every linear layer under ``modules`` (and of those modules
    themselves, e.g. an LM head) for oneDNN, after loading; returns how many were packed.
    The weights must not change afterwards. A no-op off the CPU or outside fp32."""
    count = 0
    for root in modules:
        for m in root.modules():
            plain = isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and m.method is UNQUANTIZED
            if plain or (m is root and isinstance(m, VocabParallelEmbedding) and m.head_quant is None):
                assert isinstance(m, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding))
                m.packed = cpu_linear.pack(m.get_parameter("weight"))
                count += m.packed is not None
    return count


def default_weight_loader(param: nn.Parameter, full: TensorSource, shard_id: str | None) -> None:
    """Replicated parameters (norm gains): every rank reads the tensor whole."""
    param.data.copy_(read_whole(full))
