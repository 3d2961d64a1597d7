"""The W8A8 linear method: 8-bit weights with one scale per output channel, activations
quantized per token (by the op before the layer when it can, else here), one fused GEMM.

Under tensor parallelism a row-parallel layer's activations are quantized per token on this
rank's slice of the row (one scale per slice, not per row: an all-reduce per layer and step
would cost more than it is worth), so W8A8 outputs are close to one rank's, not bit-identical."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tessel.engine.models.layers.collectives import all_reduce
from tessel.engine.models.layers.linear import (
    LinearMethod,
    RowParallelLinear,
    WeightLoader,
    make_param,
)
from tessel.kernels import dispatch
from tessel.kernels.quant import reference as quant_reference
from tessel.kernels.quant.types import QuantizedTensor


class W8A8LinearMethod(LinearMethod):
    """``y = dequant(q(x) @ q(W).T) + b`` with int8 (int32 accumulation) or E4M3 (fp32)."""

    def __init__(self, qdtype: torch.dtype, from_checkpoint: bool) -> None:
        self.qdtype = qdtype
        self.from_checkpoint = from_checkpoint  # 8-bit weight + weight_scale come from the checkpoint

    @property
    def input_quant(self) -> torch.dtype | None:  # type: ignore[override]
        return self.qdtype

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, loader: WeightLoader) -> None:
        if not self.from_checkpoint:  # float weight, quantized in process_weights_after_loading
            super().create_weights(layer, in_features, out_features, loader)
            return
        layer.weight = make_param((out_features, in_features), loader, dtype=self.qdtype, input_dim=1)
        # compressed-tensors stores the per-channel scale as [out, 1], any float dtype
        layer.weight_scale = make_param((out_features, 1), loader, dtype=torch.float32)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.from_checkpoint:
            scale = layer.get_parameter("weight_scale").data.float()
        else:
            weight = layer.get_parameter("weight").data
            quantized = quant_reference.quantize_rows(weight, self.qdtype, whole_row_absmax(layer, weight))
            layer.weight = nn.Parameter(quantized.data, requires_grad=False)
            scale = quantized.scale
        layer.weight_scale = nn.Parameter(scale.reshape(-1, 1).contiguous(), requires_grad=False)

    def apply(self, layer: nn.Module, x: Any, bias: torch.Tensor | None) -> torch.Tensor:
        xq = x if isinstance(x, QuantizedTensor) else dispatch.quantize_rows(x, self.qdtype)
        out = dispatch.scaled_mm(
            xq.data, xq.scale, layer.weight, layer.weight_scale, bias, xq.dtype  # type: ignore[arg-type]
        )
        return out.view(*x.shape[:-1], out.shape[-1])


def whole_row_absmax(layer: nn.Module, weight: torch.Tensor) -> torch.Tensor | None:
    """A row-parallel shard holds part of each output row: the ranks agree on the whole row's
    max |w| (a MAX all-reduce at load time), so each output channel gets one scale, as at one
    rank and as a quantized checkpoint stores it. None where the rows are whole."""
    if not isinstance(layer, RowParallelLinear) or layer.tp.size == 1:
        return None
    return all_reduce(weight.abs().amax(dim=-1, keepdim=True).float(), op=dist.ReduceOp.MAX)
