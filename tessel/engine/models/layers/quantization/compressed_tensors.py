"""Read a checkpoint's compressed-tensors ``quantization_config`` (as llm-compressor writes it).

Supported: one config group targeting every Linear, symmetric 8-bit weights per output channel
(static) and symmetric 8-bit activations per token (dynamic), int ("W8A8-Dynamic-Per-Token",
format int-quantized) or float ("FP8-Dynamic", format float-quantized). Anything else is named
in a ``CheckpointError`` rather than loaded wrongly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tessel.engine.loader import CheckpointError
from tessel.engine.models.layers.linear import TensorSource, read_whole

_FORMATS = {"int": ("int-quantized", "naive-quantized"), "float": ("float-quantized", "naive-quantized")}


@dataclass(frozen=True)
class CheckpointQuantization:
    """What the checkpoint's weights already are."""

    scheme: str  # "int8" or "fp8"
    ignore: tuple[str, ...]  # module names, or "re:<regex>", left unquantized


def read_checkpoint_quantization(hf_config: dict[str, Any]) -> CheckpointQuantization | None:
    """None for an unquantized checkpoint; a ``CheckpointError`` naming any unsupported field."""
    qc = hf_config.get("quantization_config") or hf_config.get("compression_config")
    if not qc:
        return None
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise CheckpointError(
            f"quantization_config.quant_method={method!r} is not supported; Tessel loads "
            "compressed-tensors W8A8 checkpoints (int8 or fp8 weights per channel, dynamic per-token activations)"
        )
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise CheckpointError(f"quantization_config.quantization_status={status!r}: only 'compressed' weights load")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise CheckpointError(f"quantization_config has {len(groups)} config_groups; exactly one is supported")
    group = next(iter(groups.values()))
    if "Linear" not in (group.get("targets") or []):
        raise CheckpointError(f"config group targets {group.get('targets')}; only ['Linear'] is supported")
    weights, acts = group.get("weights") or {}, group.get("input_activations") or {}
    kind = _expect(weights, "weights", strategy="channel", dynamic=False)
    if _expect(acts, "input_activations", strategy="token", dynamic=True) != kind:
        raise CheckpointError("weights and input_activations must both be int or both be float")
    if group.get("output_activations") or qc.get("kv_cache_scheme"):
        raise CheckpointError("output_activations / kv_cache_scheme quantization is not supported")
    fmt = group.get("format") or qc.get("format")
    if fmt not in _FORMATS[kind]:
        raise CheckpointError(f"quantization_config.format={fmt!r}; {kind} W8A8 needs one of {_FORMATS[kind]}")
    return CheckpointQuantization("int8" if kind == "int" else "fp8", tuple(qc.get("ignore") or ()))


def _expect(args: dict[str, Any], where: str, *, strategy: str, dynamic: bool) -> str:
    got = {k: args.get(k) for k in ("num_bits", "symmetric", "strategy", "dynamic", "type")}
    want = {"num_bits": 8, "symmetric": True, "strategy": strategy, "dynamic": dynamic}
    if any(got[k] != v for k, v in want.items()) or got["type"] not in ("int", "float"):
        raise CheckpointError(f"quantization_config {where} is {got}; supported: {want} with type int or float")
    return str(got["type"])


def drop_zero_points(weights: Iterator[tuple[str, TensorSource]]) -> Iterator[tuple[str, TensorSource]]:
    """Skip the all-zero zero points some exports store for symmetric schemes; a non-zero one
    would mean an asymmetric scheme, which is refused."""
    for name, tensor in weights:
        if name.endswith("_zero_point"):
            if torch.count_nonzero(read_whole(tensor)):
                raise CheckpointError(f"{name} is non-zero: asymmetric quantization is not supported")
            continue
        yield name, tensor
