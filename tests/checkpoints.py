"""Tiny real checkpoints written on the fly: a HF directory (llama / qwen2 / qwen3 / qwen3_moe /
mixtral, single-file or sharded) with a byte-level BPE tokenizer and chat template, and the same
model as a GGUF file written the way llama.cpp's converter writes it (q/k rows permuted for llama)."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world, hello tokens!",
    "Serving language models: paged attention, continuous batching, prefix caching.",
    "Numbers 0123456789 and unicode: héllo wörld, 日本語, emoji 🎉.",
]
_ARCHS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}
_GGUF_ARCH = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "mixtral": gguf.MODEL_ARCH.LLAMA,  # llama.cpp converts Mixtral as llama with experts
}
_PERMUTED = ("llama", "mixtral")  # convert_hf_to_gguf.py's LlamaModel permutes q/k rows


@lru_cache(maxsize=1)
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE of ~300 tokens: ids 0-2 are the chat specials, then 256 bytes, then merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 5, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def tiny_config(arch: str = "llama", **overrides: Any) -> Any:
    """A transformers config of real structure and toy size (2 layers, hidden 64, GQA 4:2)."""
    import transformers

    fields: dict[str, Any] = {
        "vocab_size": len(tiny_tokenizer()),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    fields.update(overrides)
    if arch == "qwen3_moe":  # 8 experts of width 32, top-2, unless overridden
        fields = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, **fields}
    if arch == "mixtral":  # 8 experts of width 32 (Mixtral's intermediate_size), top-2
        fields = {"num_local_experts": 8, "num_experts_per_tok": 2, **fields}
        fields["intermediate_size"] = overrides.get("intermediate_size", 32)
    return getattr(transformers, _ARCHS[arch].replace("ForCausalLM", "Config"))(**fields)


def write_tiny_checkpoint(
    tmp_path: Path, arch: str = "llama", *, max_shard_size: str | None = None, **overrides: Any
) -> Path:
    """Save a randomly initialised tiny ``arch`` model + tokenizer under ``tmp_path``; return the directory.

    Every parameter, norms included, is drawn at random (seed 0) so a loader that swaps or
    mis-reshapes any tensor fails an equality check. ``max_shard_size`` (e.g. ``"40KB"``) shards it.
    """
    import transformers

    config = tiny_config(arch, **overrides)
    torch.manual_seed(0)
    model = getattr(transformers, _ARCHS[arch])(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.05)
    directory = tmp_path / f"tiny-{arch}"
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def write_tiny_gguf(hf_dir: Path, path: Path, *, add_bos_token: bool = False) -> Path:
    """Write ``hf_dir``'s model as an F32 GGUF the way convert_hf_to_gguf.py does: llama.cpp's
    tensor names (gguf's own name map, not ours), q/k rows permuted for llama and Mixtral, each
    layer's experts stacked into one [E, ...] tensor per part, tokenizer metadata."""
    from safetensors.torch import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    arch = config["model_type"]
    n_layers, n_heads, n_kv = (
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[_GGUF_ARCH[arch]])
    writer.add_block_count(n_layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(config["head_dim"])
    writer.add_rope_dimension_count(config["head_dim"])
    # transformers 5 nests rope_theta inside rope_parameters
    rope_theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    experts = config.get("num_local_experts") or config.get("num_experts")
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if config.get("moe_intermediate_size"):
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    _add_tokenizer(writer, hf_dir, add_bos_token)

    names = gguf.get_tensor_name_map(_GGUF_ARCH[arch], n_layers)
    state = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        state.update(load_file(file))
    for name, tensor in _stack_experts(state).items():
        array = tensor.float().numpy()
        if arch in _PERMUTED and ".q_proj." in name:
            array = _permute(array, n_heads)
        elif arch in _PERMUTED and ".k_proj." in name:
            array = _permute(array, n_kv)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")


def _stack_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``...experts.{e}.{part}.weight`` -> ``...experts.{part}.weight`` [E, ...], the merged name
    the converters hand to gguf's name map."""
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in state.items():
        match = _EXPERT.match(name)
        if match is None:
            out[name] = tensor
            continue
        block, expert, part = match.groups()
        stacks.setdefault(f"{block}.{part}.weight", {})[int(expert)] = tensor
    for name, by_expert in stacks.items():
        out[name] = torch.stack([by_expert[e] for e in range(len(by_expert))])
    return out


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _add_tokenizer(writer: gguf.GGUFWriter, hf_dir: Path, add_bos_token: bool) -> None:
    spec = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = spec["model"]["vocab"]
    specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
    vocab.update(specials)
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(specials["<|im_start|>"])
    writer.add_eos_token_id(specials["<|im_end|>"])
    writer.add_pad_token_id(specials["<|im_end|>"])
    writer.add_add_bos_token(add_bos_token)
    writer.add_chat_template(CHAT_TEMPLATE)
