"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights before quantizing.

For a linear layer ``x W^T`` and per-input-channel ``s_j = max|x_j|^a / max|W_:,j|^(1-a)``,
``(x / s)(W s)^T`` is the same product with flatter activations. ``1 / s`` is folded into the op
that produces ``x``: the RMSNorm gain before qkv and gate/up, the up projection's rows before
down (``silu(g) * (u / s) = (silu(g) * u) / s``). o_proj's input (attention output) has no such
op to fold into and is left as is, as in the paper.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from tessel.engine.models.layers.collectives import all_reduce
from tessel.engine.models.layers.linear import ColumnParallelLinear, pack_cpu_weights
from tessel.engine.models.layers.quantization.calibration import prefill_hidden

SMOOTHED = ("qkv_proj", "gate_up_proj", "down_proj")
_FLOOR = 1e-5


@torch.inference_mode()
def input_absmax(model: nn.Module, prompts: Iterable[list[int]]) -> dict[str, torch.Tensor]:
    """Per-input-channel max |x| of every smoothed layer over the calibration prompts."""
    stats: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in SMOOTHED:
            def record(mod: nn.Module, args: tuple[torch.Tensor, ...], name: str = name) -> None:
                amax = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float()
                stats[name] = torch.maximum(stats[name], amax) if name in stats else amax
            hooks.append(module.register_forward_pre_hook(record))
    try:
        for ids in prompts:
            prefill_hidden(model, ids)
    finally:
        for hook in hooks:
            hook.remove()
    return stats


def smoothing_scales(act_absmax: torch.Tensor, w_absmax: torch.Tensor, alpha: float) -> torch.Tensor:
    """``s_j = max|x_j|^alpha / max|W_:,j|^(1 - alpha)``, floored so no channel divides by ~0."""
    w_absmax = w_absmax.clamp(min=_FLOOR)
    return (act_absmax.clamp(min=_FLOOR).pow(alpha) / w_absmax.pow(1 - alpha)).clamp(min=_FLOOR)


def input_channel_absmax(layer: nn.Module) -> torch.Tensor:
    """``max|W_:,j|`` per input channel. A column-parallel shard holds some of the rows: the
    ranks take the max over all of them, so every rank folds the same scales into the norm gain
    they all hold (its inputs are replicated, the same bits on every rank)."""
    w_absmax = layer.get_parameter("weight").detach().abs().amax(0).float()
    if isinstance(layer, ColumnParallelLinear) and layer.tp.size > 1:
        all_reduce(w_absmax, op=dist.ReduceOp.MAX)
    return w_absmax


@torch.inference_mode()
def smooth_model(model: nn.Module, prompts: Iterable[list[int]], alpha: float) -> None:
    """Calibrate on ``prompts`` and fold the smoothing scales into every decoder layer."""
    stats = input_absmax(model, prompts)
    layers = cast(list[Any], model.get_submodule("model.layers"))  # LlamaDecoderLayer, duck-typed
    for i, layer in enumerate(layers):
        prefix = f"model.layers.{i}"
        attn, mlp = layer.self_attn, layer.mlp
        s = smoothing_scales(stats[f"{prefix}.self_attn.qkv_proj"], input_channel_absmax(attn.qkv_proj), alpha)
        _fold(layer.input_layernorm.weight, attn.qkv_proj.weight, s)
        s = smoothing_scales(stats[f"{prefix}.mlp.gate_up_proj"], input_channel_absmax(mlp.gate_up_proj), alpha)
        _fold(layer.post_attention_layernorm.weight, mlp.gate_up_proj.weight, s)
        # down_proj's input channels are this rank's slice of the MLP width, its rows whole: local
        s = smoothing_scales(stats[f"{prefix}.mlp.down_proj"], input_channel_absmax(mlp.down_proj), alpha)
        up = mlp.gate_up_proj.weight.shape[0] // 2  # rows [up:] are the up projection (this rank's)
        mlp.gate_up_proj.weight.data[up:] /= s[:, None].to(mlp.gate_up_proj.weight.dtype)
        if mlp.gate_up_proj.bias is not None:
            mlp.gate_up_proj.bias.data[up:] /= s.to(mlp.gate_up_proj.bias.dtype)
        mlp.down_proj.weight.data *= s[None, :].to(mlp.down_proj.weight.dtype)
    # The CPU engine's oneDNN copies of the weights just went stale: pack them anew.
    pack_cpu_weights(list(layers))


def _fold(norm_weight: torch.Tensor, weight: torch.Tensor, s: torch.Tensor) -> None:
    norm_weight.data /= s.to(norm_weight.dtype)
    weight.data *= s[None, :].to(weight.dtype)
