"""The architecture facts the engine needs, read from a Hugging Face ``config.json`` dict."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
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
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
            bos_token_id=hf.get("bos_token_id"),
        )
