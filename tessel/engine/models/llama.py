"""One decoder for the Llama family: Llama 2/3, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k norm),
SmolLM2. Parameter names follow Hugging Face's, with q/k/v and gate/up fused.

Tensor parallel (Megatron): q/k/v and gate/up are column-parallel (each rank its heads and its
slice of the MLP width), o_proj and down_proj row-parallel with an all-reduce, the embedding and
LM head vocab-parallel; rank 0 gathers the logits."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from tessel.config.model_arch import ModelArch
from tessel.engine.models.layers.attention import PagedAttention
from tessel.engine.models.layers.collectives import gather_columns
from tessel.engine.models.layers.linear import (
    UNQUANTIZED,
    ColumnParallelLinear,
    LinearMethod,
    RowParallelLinear,
    TensorSource,
    VocabParallelEmbedding,
    default_weight_loader,
    pack_cpu_weights,
)
from tessel.engine.models.layers.norm import RMSNorm
from tessel.engine.models.layers.parallel import SINGLE, ParallelRank
from tessel.engine.models.layers.quantization import QuantConfig
from tessel.engine.models.layers.rotary import RotaryEmbedding
from tessel.kernels import dispatch
from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.quant.types import QuantizedTensor

KVCache = tuple[torch.Tensor, torch.Tensor]

# checkpoint name fragment -> (our fused module, shard id)
PACKED_MODULES = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}


def _method(quant: QuantConfig | None, name: str) -> LinearMethod:
    """The linear method of module ``name``; W8A8 only for a checkpoint already quantized (a
    float one is quantized after loading, by ``quantize_model``)."""
    return UNQUANTIZED if quant is None else quant.linear_method(name)


class LlamaAttention(nn.Module):
    def __init__(
        self, arch: ModelArch, max_positions: int, tp: ParallelRank, quant: QuantConfig | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        d = arch.head_dim
        self.num_heads = tp.shard(arch.num_attention_heads, "num_attention_heads")
        self.num_kv_heads, first_kv = tp.kv_heads(arch.num_key_value_heads)
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        kv_rows = (self.kv_size, first_kv * d)  # a replicated KV head: several ranks read the same rows
        self.qkv_proj = ColumnParallelLinear(
            arch.hidden_size,
            [arch.num_attention_heads * d, arch.num_key_value_heads * d, arch.num_key_value_heads * d],
            bias=arch.qkv_bias,
            tp=tp,
            shard_ids=["q", "k", "v"],
            method=_method(quant, f"{prefix}.qkv_proj"),
            partition=[(self.q_size, tp.rank * self.q_size), kv_rows, kv_rows],
        )
        self.o_proj = RowParallelLinear(
            arch.num_attention_heads * d, arch.hidden_size, tp=tp, method=_method(quant, f"{prefix}.o_proj")
        )
        self.q_norm = RMSNorm(d, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = RMSNorm(d, arch.rms_norm_eps) if arch.qk_norm else None
        self.rotary = RotaryEmbedding(d, max_positions, arch.rope_theta, arch.rope_scaling)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d)
        self.head_dim = d

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor | QuantizedTensor, kv_cache: KVCache, md: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary.apply_and_store(positions, q, k, v, kv_cache, md.slot_mapping)
        return self.o_proj(self.attn(q, k, v, kv_cache, md))


class LlamaMLP(nn.Module):
    def __init__(self, arch: ModelArch, tp: ParallelRank, quant: QuantConfig | None = None, prefix: str = "") -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(
            arch.hidden_size, [arch.intermediate_size] * 2, tp=tp, shard_ids=["gate", "up"],
            method=_method(quant, f"{prefix}.gate_up_proj"),
        )
        self.down_proj = RowParallelLinear(
            arch.intermediate_size, arch.hidden_size, tp=tp, method=_method(quant, f"{prefix}.down_proj")
        )
        # quant_rotation='residual_and_down' sets it (quantization.rotation): x -> x H before down
        self.down_input_rotation: nn.Module | None = None

    def forward(self, x: torch.Tensor | QuantizedTensor) -> torch.Tensor:
        h = self.gate_up_proj(x)
        if self.down_input_rotation is not None:  # down_proj quantizes the turned input itself
            return self.down_proj(self.down_input_rotation(dispatch.silu_and_mul(h)))
        quant = self.down_proj.input_quant
        return self.down_proj(dispatch.silu_and_mul(h) if quant is None else dispatch.silu_and_mul_quant(h, quant))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, arch: ModelArch, max_positions: int, tp: ParallelRank, quant: QuantConfig | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(arch, max_positions, tp, quant, f"{prefix}.self_attn")
        self.mlp = LlamaMLP(arch, tp, quant, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        md: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm.add_and_norm(x, residual, self.self_attn.qkv_proj.input_quant)
        h = self.self_attn(positions, h, kv_cache, md)
        h, residual = self.post_attention_layernorm.add_and_norm(h, residual, self.mlp.gate_up_proj.input_quant)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, arch: ModelArch, max_positions: int, tp: ParallelRank, quant: QuantConfig | None = None) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, tp)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(arch, max_positions, tp, quant, f"model.layers.{i}")
            for i in range(arch.num_hidden_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        md: AttentionMetadata,
    ) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(positions, h, residual, kv_cache, md)
        h, _ = self.norm.add_and_norm(h, residual)
        return h


class LlamaForCausalLM(nn.Module):
    def __init__(
        self, arch: ModelArch, max_positions: int, tp: ParallelRank = SINGLE, quant: QuantConfig | None = None
    ) -> None:
        super().__init__()
        self.arch = arch
        self.tp = tp
        self.model = LlamaModel(arch, max_positions, tp, quant)
        self.lm_head = (
            None
            if arch.tie_word_embeddings
            else VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, tp)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        md: AttentionMetadata,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, md)

    @property
    def head(self) -> VocabParallelEmbedding:
        return self.lm_head if self.lm_head is not None else self.model.embed_tokens

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[rows, vocab] logits; under tensor parallelism only rank 0 gets them (None elsewhere)."""
        logits = self.head.as_head(hidden)
        if self.tp.size == 1:
            return logits
        return gather_columns(logits, self.tp, self.arch.vocab_size)

    def pack_cpu_weights(self) -> int:
        """CPU: every GEMM's weight in oneDNN's packed layout (after ``load_weights``)."""
        return pack_cpu_weights([self.model.layers, self.head])

    def load_weights(self, weights: Iterable[tuple[str, TensorSource]]) -> None:
        """Copy checkpoint tensors (HF names) into this rank's shards; every parameter must
        be covered, so a checkpoint missing a tensor fails here rather than generating junk.
        A tensor may be a lazy slice: sharded parameters then read only their own part."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied: some checkpoints still store the copy
            target, shard_id = name, None
            for fragment, (fused, shard) in PACKED_MODULES.items():
                if f".{fragment}." in name:
                    target, shard_id = name.replace(fragment, fused), shard
                    break
            param = params.get(target)
            if param is None:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {self.arch.architecture}")
            loader = getattr(param, "weight_loader", default_weight_loader)
            loader(param, tensor, shard_id)  # copy_ casts to the parameter's dtype
            loaded.add(target if shard_id is None else f"{target}:{shard_id}")
        missing = [n for n in params if not _covered(n, loaded)]
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")


def _covered(param_name: str, loaded: set[str]) -> bool:
    if param_name in loaded:
        return True
    shards = [s for f, s in PACKED_MODULES.values() if f in param_name]
    return bool(shards) and all(f"{param_name}:{s}" in loaded for s in shards)
