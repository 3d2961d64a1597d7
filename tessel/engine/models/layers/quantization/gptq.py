"""GPTQ (Frantar et al., 2023) for the W8A8 weights: round each weight column to the 8-bit grid in
turn and push its rounding error onto the columns not yet rounded, weighted by the layer's input
second moments ``H = X^T X`` from calibration prompts, so ``X W^T`` moves as little as it can.

The scales stay round-to-nearest's (one per output channel, max |w| / qmax) and the kernels are
unchanged; only which grid point each weight lands on differs. On the default model, with int8
and rotation, round-to-nearest weights cost ~2 points of top-1 agreement that quantizing the
activations alone does not (tests/engine/test_quantization_accuracy.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from tessel.engine.models.layers.quantization.calibration import prefill_hidden
from tessel.kernels.quant import reference as quant_reference
from tessel.kernels.quant.types import QuantizedTensor, qmax

BLOCK = 128  # columns rounded between two lazy updates of the rest (the paper's batching)
DAMP = 0.01  # of the mean diagonal, added to H: few calibration tokens leave it singular


@torch.inference_mode()
def input_hessians(model: nn.Module, layers: Mapping[str, nn.Module], prompts: Iterable[list[int]]) -> dict[str, torch.Tensor]:
    """``sum_t x_t x_t^T`` (float32, on the layer's device) of each named layer's input over the
    calibration prompts."""
    hessians: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in layers.items():
        def record(mod: nn.Module, args: tuple[torch.Tensor, ...], name: str = name) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            h = x.T @ x
            hessians[name] = hessians[name] + h if name in hessians else h
        hooks.append(module.register_forward_pre_hook(record))
    try:
        for ids in prompts:
            prefill_hidden(model, ids)
    finally:
        for hook in hooks:
            hook.remove()
    return hessians


def _round(w: torch.Tensor, scale: torch.Tensor, qdtype: torch.dtype) -> torch.Tensor:
    """``w`` [N] on the grid ``scale * {8-bit values}`` (round to nearest), in ``w``'s units."""
    limit = qmax(qdtype)
    q = (w / scale).clamp(-limit, limit)
    q = torch.round(q) if qdtype == torch.int8 else q.to(qdtype).double()
    return q * scale


@torch.no_grad()
def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, qdtype: torch.dtype) -> QuantizedTensor:
    """``weight`` [N, K] per output channel, with GPTQ's error feedback under ``hessian`` [K, K]."""
    w = weight.double().clone()
    scale = (w.abs().amax(dim=1).clamp(min=1e-10) / qmax(qdtype))
    h = hessian.double().clone()
    dead = torch.diagonal(h) == 0  # inputs never seen: their weights cannot matter to X W^T
    h[dead, dead] = 1.0
    h += DAMP * torch.diagonal(h).mean() * torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    # Round the columns with the largest input energy first ("act order"): their error has the
    # most columns left to absorb it.
    order = torch.argsort(torch.diagonal(h), descending=True)
    # Transposed, [K, N]: each weight column is a contiguous row, which the loop below reads and
    # updates one at a time (a third faster on the CPU than strided columns, same roundings).
    wt, h = w[:, order].T.contiguous(), h[order][:, order]
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    qt = torch.empty_like(wt)
    k = wt.shape[0]
    for start in range(0, k, BLOCK):
        end = min(start + BLOCK, k)
        errors = torch.empty(end - start, wt.shape[1], dtype=wt.dtype, device=wt.device)
        for j in range(start, end):
            qt[j] = _round(wt[j], scale, qdtype)
            err = (wt[j] - qt[j]) / u[j, j]
            wt[j + 1 : end] -= u[j, j + 1 : end][:, None] * err[None, :]
            errors[j - start] = err
        wt[end:] -= u[start:end, end:].T @ errors
    q = qt.T[:, torch.argsort(order)]
    quantized = quant_reference.quantize_rows(q, qdtype, absmax=(scale * qmax(qdtype))[:, None])
    return QuantizedTensor(quantized.data, quantized.scale, weight.dtype)
