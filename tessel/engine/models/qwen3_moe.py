"""Qwen3-MoE and Mixtral: the Llama-family decoder with a sparse MoE block in place of the MLP on
its sparse layers. Attention, norms, embedding and head are the Llama family's own; the two differ
only in data (Qwen3's q/k norm, Mixtral's always-renormalised router, every layer sparse) and in
their checkpoints' expert spelling, which ``_target`` maps onto one set of parameters."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from tessel.config.model_arch import ModelArch
from tessel.engine.models.layers.linear import (
    TensorSource,
    VocabParallelEmbedding,
    default_weight_loader,
    pack_cpu_weights,
)
from tessel.engine.models.layers.moe import FusedMoE
from tessel.engine.models.layers.norm import RMSNorm
from tessel.engine.models.layers.parallel import SINGLE, ParallelRank
from tessel.engine.models.layers.quantization import QuantConfig
from tessel.engine.models.llama import (
    PACKED_MODULES,
    KVCache,
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    _covered,
)
from tessel.kernels.attention.metadata import AttentionMetadata

# model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight (Qwen3-MoE) or
# model.layers.{l}.block_sparse_moe.experts.{e}.{w1,w3,w2}.weight (Mixtral) -> the stacked w13 / w2
_EXPERT = re.compile(
    r"^(.*)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$"
)
_EXPERT_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
_ROUTER = re.compile(r"^(.*)\.(?:mlp|block_sparse_moe)\.gate\.weight$")


class Qwen3MoeDecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, max_positions: int, tp: ParallelRank, layer: int) -> None:
        super().__init__()
        prefix = f"model.layers.{layer}"
        self.self_attn = LlamaAttention(arch, max_positions, tp, None, f"{prefix}.self_attn")
        self.mlp: nn.Module = (
            FusedMoE(
                arch.num_experts, arch.num_experts_per_tok, arch.hidden_size,
                arch.moe_intermediate_size, arch.norm_topk_prob, tp,
            )
            if arch.is_moe_layer(layer)
            else LlamaMLP(arch, tp, None, f"{prefix}.mlp")
        )
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
        kv_cache: KVCache, md: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm.add_and_norm(x, residual)
        h = self.self_attn(positions, h, kv_cache, md)
        h, residual = self.post_attention_layernorm.add_and_norm(h, residual)
        return self.mlp(h), residual


class Qwen3MoeModel(LlamaModel):
    """LlamaModel's forward over MoE decoder layers."""

    def __init__(self, arch: ModelArch, max_positions: int, tp: ParallelRank) -> None:
        nn.Module.__init__(self)  # LlamaModel's __init__ would build dense layers
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, tp)
        self.layers = nn.ModuleList(
            Qwen3MoeDecoderLayer(arch, max_positions, tp, i) for i in range(arch.num_hidden_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    def __init__(
        self, arch: ModelArch, max_positions: int, tp: ParallelRank = SINGLE, quant: QuantConfig | None = None
    ) -> None:
        if quant is not None:
            raise ValueError("quantization is not supported for mixture-of-experts models yet")
        nn.Module.__init__(self)
        self.arch = arch
        self.tp = tp
        self.model = Qwen3MoeModel(arch, max_positions, tp)
        self.lm_head = (
            None if arch.tie_word_embeddings else VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, tp)
        )

    def pack_cpu_weights(self) -> int:
        return pack_cpu_weights([self.model.layers, self.head])

    def load_weights(self, weights: Iterable[tuple[str, TensorSource]]) -> None:
        """HF names in; per-expert tensors go into their slice of the stacked weights. Every
        parameter (every expert's every part) must be covered. A tensor may be a lazy slice (a
        tensor-parallel rank reads only its part); ``copy_`` casts to the parameter's dtype."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        expert_parts: dict[str, set[str]] = {}
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and self.lm_head is None):
                continue
            target, shard_id = _target(name)
            param = params.get(target)
            if param is None:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {self.arch.architecture}")
            loader = getattr(param, "weight_loader", default_weight_loader)
            loader(param, tensor, shard_id)
            if _EXPERT.match(name):
                expert_parts.setdefault(target, set()).add(shard_id or "")
            else:
                loaded.add(target if shard_id is None else f"{target}:{shard_id}")
        per_expert = {"w13": 2 * self.arch.num_experts, "w2": self.arch.num_experts}
        for target, parts in expert_parts.items():
            if len(parts) == per_expert[target.rsplit(".", 1)[1]]:
                loaded.add(target)
        missing = [n for n in params if not _covered(n, loaded)]
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")


def _target(name: str) -> tuple[str, str | None]:
    """Our parameter name and shard id for checkpoint tensor ``name``."""
    match = _EXPERT.match(name)
    if match is not None:
        layer, expert, spelled = match.groups()
        part = _EXPERT_PART[spelled]
        return (f"{layer}.mlp.w2", f"{expert}:down") if part == "down" else (f"{layer}.mlp.w13", f"{expert}:{part}")
    router = _ROUTER.match(name)
    if router is not None:  # a bare parameter of FusedMoE
        return f"{router.group(1)}.mlp.gate", None
    for fragment, (fused, shard) in PACKED_MODULES.items():
        if f".{fragment}." in name:
            return name.replace(fragment, fused), shard
    return name, None
