"""A Hugging Face ``config.json`` rebuilt from GGUF metadata (llama.cpp's ``<arch>.*`` keys)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tessel.engine.loader.checkpoint import CheckpointError
from tessel.engine.loader.gguf_reader import GgufFile
from tessel.engine.loader.names import GGUF_ARCHITECTURES, GGUF_MOE_ARCHITECTURES

# The Llama-3.1/3.2 "llama3" RoPE scaling. GGUF stores only its result (the ``rope_freqs`` tensor of
# per-frequency divisors), so we recognise it by recomputing those divisors from these parameters.
_LLAMA3_ROPE: dict[str, Any] = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def gguf_architecture(gguf: GgufFile) -> str:
    """The GGUF architecture, checked against the ones the engine implements."""
    arch = gguf.metadata.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(
            f"{gguf.path}: unknown architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    return str(arch)


def hf_config_from_gguf(gguf: GgufFile) -> dict[str, Any]:
    """The config.json transformers would write for this model."""
    arch = gguf_architecture(gguf)
    meta = gguf.metadata

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise CheckpointError(f"{gguf.path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = meta.get(f"{arch}.attention.key_length") or meta.get(f"{arch}.rope.dimension_count")
    tokens = meta.get("tokenizer.ggml.tokens")
    config: dict[str, Any] = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(get("attention.head_count_kv", n_heads)),
        "head_dim": int(head_dim or hidden // n_heads),
        "vocab_size": int(get("vocab_size", len(tokens) if tokens else None)),
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(gguf, arch),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "mlp_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    config.update(_moe_fields(gguf, arch))
    if arch == "qwen2":
        config.pop("attention_bias")  # Qwen2's q/k/v always carry a bias; its config has no flag
    # GGUF stores float32, so 1e-5 reads back as 9.99999974e-06; 7 digits restore the decimal
    config["rms_norm_eps"] = float(f"{config['rms_norm_eps']:.7g}")
    return config


def _moe_fields(gguf: GgufFile, arch: str) -> dict[str, Any]:
    """Experts, top-k, expert width and router normalisation; the architecture a file with experts
    is (a llama GGUF with experts is Mixtral). Nothing for a dense model."""
    meta = gguf.metadata
    experts = int(meta.get(f"{arch}.expert_count") or 0)
    if not experts:
        if arch == "qwen3moe":
            raise CheckpointError(f"{gguf.path}: qwen3moe GGUF without {arch}.expert_count")
        return {}
    hf_arch = GGUF_ARCHITECTURES[arch] if arch == "qwen3moe" else GGUF_MOE_ARCHITECTURES.get(arch)
    if hf_arch is None:
        raise CheckpointError(f"{gguf.path}: a {arch} GGUF with {experts} experts is not supported")
    if meta.get(f"{arch}.expert_shared_count"):
        raise CheckpointError(f"{gguf.path}: shared experts ({arch}.expert_shared_count) are not supported")
    fields: dict[str, Any] = {
        "architectures": [hf_arch],
        "num_experts_per_tok": int(meta[f"{arch}.expert_used_count"]),
    }
    if hf_arch == "MixtralForCausalLM":  # its expert width is feed_forward_length
        return {**fields, "model_type": "mixtral", "num_local_experts": experts}
    layers = int(meta[f"{arch}.block_count"])
    return {
        **fields,
        "model_type": "qwen3_moe",
        "num_experts": experts,
        "moe_intermediate_size": int(meta[f"{arch}.expert_feed_forward_length"]),
        # llama.cpp normalises Qwen3-MoE's top-k unless the file says otherwise
        "norm_topk_prob": bool(meta.get(f"{arch}.expert_weights_norm", True)),
        # a layer without a router keeps its dense MLP
        "mlp_only_layers": [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in gguf.tensors],
    }


def _rope_scaling(gguf: GgufFile, arch: str) -> dict[str, Any] | None:
    meta = gguf.metadata
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in ("linear", "yarn"):
        scaling: dict[str, Any] = {
            "rope_type": kind,
            "factor": float(meta[f"{arch}.rope.scaling.factor"]),
        }
        original = meta.get(f"{arch}.rope.scaling.original_context_length")
        if original:
            scaling["original_max_position_embeddings"] = int(original)
        return scaling
    if "rope_freqs.weight" in gguf.tensors:
        return _llama3_scaling(gguf, arch)
    return None


def _llama3_scaling(gguf: GgufFile, arch: str) -> dict[str, Any]:
    """Recover Llama-3's rope_scaling from the stored divisors, refusing any we cannot reproduce."""
    info = gguf.tensors["rope_freqs.weight"]
    stored = gguf.raw(info).view(np.float32).reshape(-1).astype(np.float64)
    factor = float(stored.max())
    low, high = float(_LLAMA3_ROPE["low_freq_factor"]), float(_LLAMA3_ROPE["high_freq_factor"])
    original = float(_LLAMA3_ROPE["original_max_position_embeddings"])
    dim = 2 * len(stored)
    theta = float(gguf.metadata.get(f"{arch}.rope.freq_base", 10000.0))
    wavelen = 2 * math.pi * theta ** (np.arange(0, dim, 2) / dim)
    smooth = (original / wavelen - low) / (high - low)
    mixed = 1.0 / ((1 - smooth) / factor + smooth)
    expected = np.where(
        wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, mixed)
    )
    if not np.allclose(stored, expected, rtol=1e-3):
        raise CheckpointError(
            f"{gguf.path}: rope_freqs.weight does not match Llama-3 RoPE scaling; unsupported"
        )
    return {"rope_type": "llama3", "factor": factor, **_LLAMA3_ROPE}
