"""RMSNorm, optionally fused with the residual add that precedes it and with the per-token
quantization of the linear layer that follows it."""

from __future__ import annotations

from typing import overload

import torch
from torch import nn

from tessel.kernels import dispatch
from tessel.kernels.quant.types import QuantizedTensor


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch.rms_norm(x, self.weight, self.eps)

    @overload
    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, quant: None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, quant: torch.dtype | None
    ) -> tuple[torch.Tensor | QuantizedTensor, torch.Tensor]: ...
    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, quant: torch.dtype | None = None
    ) -> tuple[torch.Tensor | QuantizedTensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual); the first layer has no residual yet.

        ``quant``: the next layer's ``input_quant``; the normed output is then quantized per token
        in the same kernel."""
        if quant is not None:
            return dispatch.rms_norm_quant(x, residual, self.weight, self.eps, quant)
        if residual is None:
            return dispatch.rms_norm(x, self.weight, self.eps), x
        return dispatch.fused_add_rms_norm(x, residual, self.weight, self.eps)
