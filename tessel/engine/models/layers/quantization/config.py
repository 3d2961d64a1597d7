"""``QuantConfig``: which W8A8 scheme applies, whether the checkpoint already holds it, and which
layers it covers (``config.quantization.QUANTIZED_LAYERS`` minus the checkpoint's ignore list)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from tessel.config.quantization import CHECKPOINT_FRAGMENTS, QUANTIZED_LAYERS
from tessel.config.settings import ModelConfig
from tessel.engine.models.layers.linear import UNQUANTIZED, LinearMethod
from tessel.engine.models.layers.quantization.compressed_tensors import read_checkpoint_quantization
from tessel.engine.models.layers.quantization.w8a8 import W8A8LinearMethod
from tessel.kernels.quant.types import QUANT_DTYPES

FP8_MIN_CAPABILITY = (8, 9)  # E4M3 tensor cores: Ada (8.9), Hopper (9.0) and newer


@dataclass(frozen=True)
class QuantConfig:
    """The model's W8A8 plan, resolved once before the model is built."""

    scheme: str  # "int8" or "fp8"
    from_checkpoint: bool  # the checkpoint stores 8-bit weights and scales
    ignore: tuple[str, ...] = ()  # checkpoint module names or "re:<regex>" kept unquantized
    smoothquant_alpha: float | None = None
    calibration_path: str | None = None
    rotation: str | None = None  # ModelConfig.quant_rotation: "residual" or "residual_and_down"
    lm_head: bool = False  # ModelConfig.quantize_lm_head
    gptq: bool = False  # ModelConfig.quant_gptq

    @property
    def qdtype(self) -> torch.dtype:
        return QUANT_DTYPES[self.scheme]

    def is_quantized(self, module: str) -> bool:
        """``module``: our name, e.g. ``model.layers.3.self_attn.qkv_proj``."""
        prefix, _, leaf = module.rpartition(".")
        if leaf not in QUANTIZED_LAYERS:
            return False
        parts = [f"{prefix}.{p}" for p in CHECKPOINT_FRAGMENTS.get(leaf, (leaf,))]
        ignored = [p for p in parts if any(_matches(entry, p) for entry in self.ignore)]
        if ignored and len(ignored) != len(parts):
            raise ValueError(
                f"the checkpoint leaves {ignored} unquantized but not the rest of {parts}, "
                f"which Tessel fuses into one layer ({leaf})"
            )
        return not ignored

    def linear_method(self, module: str) -> LinearMethod:
        """At build time only an already-quantized checkpoint's layers need 8-bit parameters."""
        if self.from_checkpoint and self.is_quantized(module):
            return W8A8LinearMethod(self.qdtype, from_checkpoint=True)
        return UNQUANTIZED


def _matches(entry: str, name: str) -> bool:
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    return entry == name


def resolve_quant_config(cfg: ModelConfig, hf_config: dict[str, Any], device: torch.device) -> QuantConfig | None:
    """None: run unquantized. ``ValueError`` when the request and the checkpoint disagree, or fp8
    is asked of a device without E4M3 support."""
    ckpt = read_checkpoint_quantization(hf_config)
    if ckpt is not None:
        if cfg.quantization not in (None, ckpt.scheme):
            raise ValueError(
                f"quantization={cfg.quantization!r}, but the checkpoint is already {ckpt.scheme} (compressed-tensors)"
            )
        if cfg.smoothquant_alpha is not None:
            raise ValueError("smoothquant_alpha applies to load-time quantization; this checkpoint is already quantized")
        if cfg.quant_rotation is not None:
            raise ValueError("quant_rotation applies to load-time quantization; this checkpoint is already quantized")
        if cfg.quantize_lm_head:
            raise ValueError("quantize_lm_head applies to load-time quantization; this checkpoint is already quantized")
        if cfg.quant_gptq:
            raise ValueError("quant_gptq applies to load-time quantization; this checkpoint is already quantized")
        quant = QuantConfig(ckpt.scheme, from_checkpoint=True, ignore=ckpt.ignore)
    elif cfg.quantization is None:
        return None
    else:
        quant = QuantConfig(
            cfg.quantization, from_checkpoint=False,
            smoothquant_alpha=cfg.smoothquant_alpha, calibration_path=cfg.smoothquant_calibration,
            rotation=cfg.quant_rotation, lm_head=cfg.quantize_lm_head, gptq=cfg.quant_gptq,
        )
    if quant.scheme == "fp8":
        check_fp8_device(device)
    return quant


def check_fp8_device(device: torch.device) -> None:
    """fp8 runs on E4M3 tensor cores only: CUDA with compute capability >= 8.9."""
    need = ".".join(map(str, FP8_MIN_CAPABILITY))
    if device.type != "cuda":
        raise ValueError(
            f"quantization='fp8' needs a CUDA GPU with compute capability >= {need} (Ada, Hopper or newer); "
            f"this engine runs on {device.type}. Use quantization='int8' there."
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < FP8_MIN_CAPABILITY:
        raise ValueError(
            f"quantization='fp8' needs compute capability >= {need}; {torch.cuda.get_device_name(device)} "
            f"has {cap[0]}.{cap[1]}. Use quantization='int8' there."
        )
