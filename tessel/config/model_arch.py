"""The architecture facts the engine needs, read from a Hugging Face ``config.json`` dict."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
)


class RopeScaling(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


class ModelArch(BaseModel):
    """A Llama-family decoder's shape. Qwen2 adds a q/k/v bias, Qwen3 a per-head q/k RMSNorm."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    """One expert's SwiGLU width (Mixtral's config calls it ``intermediate_size``)."""
    norm_topk_prob: bool = False
    """Renormalise the top-k routing weights to sum to 1 (Qwen3-MoE's config flag; always on for Mixtral)."""
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    """Layers that keep a dense MLP in a MoE model."""

    def is_moe_layer(self, layer: int) -> bool:
        """Qwen3-MoE's rule: every ``decoder_sparse_step``-th layer not listed as MLP-only."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelArch:
        archs = hf.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or hf.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        # transformers 5 writes "rope_parameters" (theta inside); older configs "rope_scaling".
        rope_params = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or rope_params or None
        if scaling is not None and "rope_type" not in scaling and "type" in scaling:
            scaling = {**scaling, "rope_type": scaling["type"]}
        theta = hf.get("rope_theta") or rope_params.get("rope_theta") or 10000.0
        _refuse_shared_experts(hf)
        mixtral = arch == "MixtralForCausalLM"
        return cls(
            architecture=arch,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=RopeScaling(**scaling) if scaling else None,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(hf.get("attention_bias", False)),
            qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
            eos_token_ids=eos_ids,
            bos_token_id=hf.get("bos_token_id"),
            # transformers 5 writes num_local_experts; Hub Qwen3-MoE configs num_experts
            num_experts=int(hf.get("num_experts") or hf.get("num_local_experts") or 0),
            num_experts_per_tok=int(hf.get("num_experts_per_tok") or 0),
            moe_intermediate_size=int(
                hf["intermediate_size"] if mixtral else hf.get("moe_intermediate_size") or 0
            ),
            # Mixtral's router renormalises the top-k softmax unconditionally (MixtralTopKRouter)
            norm_topk_prob=mixtral or bool(hf.get("norm_topk_prob", False)),
            decoder_sparse_step=int(hf.get("decoder_sparse_step") or 1),
            mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
        )


def _refuse_shared_experts(hf: dict[str, Any]) -> None:
    """Qwen3-MoE and Mixtral have no shared expert; a config that asks for one (Qwen2-MoE style)
    would load without it and generate junk, so it is refused by name."""
    shared = hf.get("shared_expert_intermediate_size") or hf.get("n_shared_experts")
    if shared:
        raise ValueError(
            f"shared experts (shared_expert_intermediate_size / n_shared_experts = {shared}) "
            "are not supported; only routed-expert MoE models (Qwen3-MoE, Mixtral) are"
        )
