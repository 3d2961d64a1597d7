"""Checkpoint architecture name -> model class. The Llama family shares one definition;
new families (mixture-of-experts among them) register their own class here."""

from __future__ import annotations

from torch import nn

from tessel.config.model_arch import ModelArch
from tessel.engine.models.layers.parallel import SINGLE, ParallelRank
from tessel.engine.models.layers.quantization import QuantConfig
from tessel.engine.models.llama import LlamaForCausalLM
from tessel.engine.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    # the same sparse decoder: no q/k norm, every layer sparse, router renormalised (ModelArch)
    "MixtralForCausalLM": Qwen3MoeForCausalLM,
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
