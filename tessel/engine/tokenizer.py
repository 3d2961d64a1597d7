"""Tokenizers for a Hugging Face directory or from a GGUF file's ``tokenizer.*`` metadata.

A GGUF has no ``tokenizer.json``: it stores the vocabulary, merges, token types and special ids
under llama.cpp's keys. We hand those to transformers' own GGUF converter, so the ids match what
``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` gives, but from metadata we already parsed
(transformers' path re-reads the file and takes ~8 s; this takes ~1 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# llama.cpp key (after "tokenizer.") -> the name transformers' converter reads it under
_TOKENIZER_KEYS = {
    "ggml.model": "tokenizer_type",
    "ggml.pre": "pre_tokenizer_type",
    "ggml.tokens": "tokens",
    "ggml.scores": "scores",
    "ggml.token_type": "token_type",
    "ggml.merges": "merges",
    "ggml.precompiled_charsmap": "precompiled_charsmap",
    "ggml.bos_token_id": "bos_token_id",
    "ggml.eos_token_id": "eos_token_id",
    "ggml.unknown_token_id": "unk_token_id",
    "ggml.padding_token_id": "pad_token_id",
    "ggml.add_space_prefix": "add_prefix_space",
}
_CONFIG_KEYS = {
    "chat_template": "chat_template",
    "ggml.add_bos_token": "add_bos_token",
    "ggml.add_eos_token": "add_eos_token",
}
_SPECIAL_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def load_tokenizer(directory: Path) -> PreTrainedTokenizerFast:
    """The fast tokenizer saved in a HF checkpoint directory, chat template included.

    Not ``AutoTokenizer``: it reads config.json through ``AutoConfig``, which imports transformers'
    modelling stack (~4-8 s). ``tokenizer.json`` fully defines the ids, so the generic class is exact.
    """
    from transformers import PreTrainedTokenizerFast

    if not (directory / "tokenizer.json").is_file():
        raise ValueError(f"{directory}: no tokenizer.json (only fast tokenizers are supported)")
    tokenizer: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(str(directory))
    return tokenizer


def tokenizer_from_gguf_metadata(metadata: Mapping[str, Any]) -> PreTrainedTokenizerFast:
    """Build the tokenizer a GGUF's metadata describes (BPE or sentencepiece), with its special
    tokens, ``add_bos_token`` and chat template."""
    from transformers import PreTrainedTokenizerFast

    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer
    except ImportError:  # transformers 4.x keeps the converter here
        from transformers.integrations.ggml import convert_gguf_tokenizer  # type: ignore[no-redef,attr-defined]

    if "tokenizer.ggml.tokens" not in metadata:
        raise ValueError("GGUF metadata has no tokenizer (tokenizer.ggml.tokens)")
    tokens = metadata["tokenizer.ggml.tokens"]
    spec = {
        name: metadata[f"tokenizer.{key}"]
        for key, name in _TOKENIZER_KEYS.items()
        if f"tokenizer.{key}" in metadata
    }
    config = {
        name: metadata[f"tokenizer.{key}"]
        for key, name in _CONFIG_KEYS.items()
        if f"tokenizer.{key}" in metadata
    }
    if spec.get("tokenizer_type") == "llama":
        config.setdefault(
            "add_bos_token", True
        )  # llama.cpp's default for sentencepiece vocabularies
    for name, key in _SPECIAL_IDS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = (
            tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None
        )
    backend, extra = convert_gguf_tokenizer(str(metadata.get("general.architecture")), spec)
    # Some transformers versions (5.17) return special tokens in ``extra`` too: ours win, unless unset.
    kwargs = {**extra, **{k: v for k, v in config.items() if v is not None or k not in extra}}
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
