"""Checkpoint architecture name -> model class. The Llama family shares one definition;
new families (mixture-of-experts among them) register their own class here."""

from __future__ import annotations

from torch import nn

from config.model_arch import ModelArch
from engine.models.layers.parallel import SINGLE, ParallelRank
from engine.models.layers.quantization import QuantConfig
from engine.models.llama import LlamaForCausalLM

MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}


def build_model(
    arch: ModelArch, max_positions: int, tp: ParallelRank = SINGLE, quant: QuantConfig | None = None
) -> nn.Module:
    cls = MODEL_REGISTRY.get(arch.architecture)
    if cls is None:
        raise ValueError(
            f"unsupported architecture {arch.architecture!r}; supported: {', '.join(MODEL_REGISTRY)}"
        )
    return cls(arch, max_positions, tp, quant)
