"""Parameter names and shapes of the supported architectures, in Hugging Face's spelling.

One table answers three questions: which HF name a GGUF tensor has, which tensors a checkpoint
must contain (to report missing ones), and what shapes random weights get.
"""

from __future__ import annotations

import re
from typing import Any

GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
}
"""GGUF ``general.architecture`` -> HF ``architectures[0]``."""
GGUF_MOE_ARCHITECTURES = {"llama": "MixtralForCausalLM"}
"""The same, for a file with experts (``<arch>.expert_count``): llama.cpp converts Mixtral as llama."""
SUPPORTED_ARCHITECTURES = (*GGUF_ARCHITECTURES.values(), *GGUF_MOE_ARCHITECTURES.values())

_GGUF_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GGUF_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GGUF_NAME = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)$")
# llama.cpp stacks every expert of a layer in one tensor [E, ...]: index into _EXPERT_SPELLING's parts
_GGUF_EXPERTS = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}


def hf_name_of_gguf(name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None if not a model parameter."""
    match = _GGUF_NAME.match(name)
    if match is None:
        return None
    layer, part, kind = match.groups()
    if layer is None:
        base = _GGUF_TOP.get(part)
        return None if base is None else f"{base}.{kind}"
    base = _GGUF_BLOCK.get(part)
    return None if base is None else f"model.layers.{layer}.{base}.{kind}"


def hf_tensors_of_gguf(
    name: str, shape: tuple[int, ...], hf_config: dict[str, Any]
) -> list[tuple[str, tuple[int, ...]]]:
    """The HF tensors (name, shape) GGUF tensor ``name`` holds: one for most; for a stacked
    ``blk.N.ffn_*_exps`` [E, ...] one per expert, the i-th being slice i; none if not a parameter."""
    match = _GGUF_NAME.match(name)
    arch = hf_config["architectures"][0]
    if match is not None and match.group(1) is not None and arch in _EXPERT_SPELLING:
        layer, part, kind = match.groups()
        block, *parts = _EXPERT_SPELLING[arch]
        if part in _GGUF_EXPERTS:
            hf_part = parts[_GGUF_EXPERTS[part]]
            prefix = f"model.layers.{layer}.{block}.experts"
            return [(f"{prefix}.{e}.{hf_part}.{kind}", shape[1:]) for e in range(shape[0])]
        if part == "ffn_gate_inp":  # the router
            return [(f"model.layers.{layer}.{block}.gate.{kind}", shape)]
    hf = hf_name_of_gguf(name)
    return [] if hf is None else [(hf, shape)]


def head_dim(hf_config: dict[str, Any]) -> int:
    """Per-head width: explicit in newer configs, else hidden size over heads."""
    explicit = hf_config.get("head_dim")
    return (
        int(explicit) if explicit else hf_config["hidden_size"] // hf_config["num_attention_heads"]
    )


def expected_shapes(hf_config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every parameter the architecture's HF model has, with its shape, in load order."""
    arch = hf_config["architectures"][0]
    hidden, vocab = hf_config["hidden_size"], hf_config["vocab_size"]
    n_heads = hf_config["num_attention_heads"]
    n_kv = hf_config.get("num_key_value_heads") or n_heads
    hd, inter = head_dim(hf_config), hf_config["intermediate_size"]
    qkv_bias = arch == "Qwen2ForCausalLM" or bool(hf_config.get("attention_bias", False))
    o_bias = arch != "Qwen2ForCausalLM" and bool(hf_config.get("attention_bias", False))
    mlp_bias = bool(hf_config.get("mlp_bias", False))

    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(hf_config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        for proj, rows in (("q_proj", n_heads * hd), ("k_proj", n_kv * hd), ("v_proj", n_kv * hd)):
            shapes[f"{p}self_attn.{proj}.weight"] = (rows, hidden)
            if qkv_bias:
                shapes[f"{p}self_attn.{proj}.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, n_heads * hd)
        if o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (hidden,)
        if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        if _is_moe_layer(hf_config, i):
            shapes.update(_expert_shapes(hf_config, p))
            continue
        for proj, shape in (
            ("gate_proj", (inter, hidden)),
            ("up_proj", (inter, hidden)),
            ("down_proj", (hidden, inter)),
        ):
            shapes[f"{p}mlp.{proj}.weight"] = shape
            if mlp_bias:
                shapes[f"{p}mlp.{proj}.bias"] = shape[:1]
    shapes["model.norm.weight"] = (hidden,)
    if not hf_config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def _num_experts(hf_config: dict[str, Any]) -> int:
    return int(hf_config.get("num_experts") or hf_config.get("num_local_experts") or 0)


def _is_moe_layer(hf_config: dict[str, Any], layer: int) -> bool:
    """Qwen3-MoE's rule (mirrors ``ModelArch.is_moe_layer``)."""
    step = int(hf_config.get("decoder_sparse_step") or 1)
    only_mlp = hf_config.get("mlp_only_layers") or ()
    return _num_experts(hf_config) > 0 and layer not in only_mlp and (layer + 1) % step == 0


# per-expert gate / up / down names: Qwen3-MoE's, and Mixtral's (under ``block_sparse_moe``)
_EXPERT_SPELLING = {
    "Qwen3MoeForCausalLM": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "MixtralForCausalLM": ("block_sparse_moe", "w1", "w3", "w2"),
}


def _expert_shapes(hf_config: dict[str, Any], prefix: str) -> dict[str, tuple[int, ...]]:
    """A MoE block's router and per-expert projections, as HF stores them (one tensor each;
    transformers 5 fuses them in memory but ``save_pretrained`` writes them back this way)."""
    arch = hf_config["architectures"][0]
    block, gate, up, down = _EXPERT_SPELLING[arch]
    hidden = hf_config["hidden_size"]
    inter = hf_config["intermediate_size" if arch == "MixtralForCausalLM" else "moe_intermediate_size"]
    n = _num_experts(hf_config)
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}{block}.gate.weight": (n, hidden)}
    for e in range(n):
        e_prefix = f"{prefix}{block}.experts.{e}."
        shapes[f"{e_prefix}{gate}.weight"] = (inter, hidden)
        shapes[f"{e_prefix}{up}.weight"] = (inter, hidden)
        shapes[f"{e_prefix}{down}.weight"] = (hidden, inter)
    return shapes


def missing_names(hf_config: dict[str, Any], present: set[str]) -> list[str]:
    """Expected parameters absent from ``present``; a tied ``lm_head`` may be stored or not."""
    return [name for name in expected_shapes(hf_config) if name not in present]


def is_norm(name: str) -> bool:
    """RMSNorm gains, which random init sets to 1 rather than noise."""
    return name.endswith(("layernorm.weight", "norm.weight"))
