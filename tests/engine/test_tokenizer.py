"""Tokenizers built from GGUF metadata give transformers' ids; HF directories load theirs."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tessel.engine.loader import default_model_path
from tessel.engine.loader.gguf_reader import read_gguf
from tessel.engine.tokenizer import load_tokenizer, tokenizer_from_gguf_metadata
from tests.checkpoints import CHAT_TEMPLATE, tiny_tokenizer, write_tiny_checkpoint, write_tiny_gguf

TEXTS = [
    "Hello, world!",
    "  leading spaces\n\n\ttabs and newlines\r\n",
    "naïve café, Straße, 日本語のテキスト, 中文, 한국어",
    "emoji 🎉👍🏽🇫🇷 and ZWJ 👨‍👩‍👧",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "numbers 1234567890 3.14159 -42 1e-5",
    "code: def f(x):\n    return x ** 2  # comment",
    "<|endoftext|><repo_name>tessel<file_sep>",
    "mixed<|im_end|>special<|im_start|>tokens",
    "",
]
MESSAGES = [{"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def ours() -> PreTrainedTokenizerFast:
    return tokenizer_from_gguf_metadata(read_gguf(default_model_path()).metadata)


@pytest.fixture(scope="module")
def reference() -> PreTrainedTokenizerFast:
    """transformers' own GGUF tokenizer (re-parses the file, ~8 s)."""
    path = default_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_default_gguf_ids_match_transformers(
    ours: PreTrainedTokenizerFast, reference: PreTrainedTokenizerFast
) -> None:
    for text in TEXTS:
        assert ours(text).input_ids == reference(text).input_ids, text
        assert ours.decode(ours(text).input_ids) == text
    assert len(ours) == len(reference) == 49152


def test_default_gguf_special_tokens_and_template(
    ours: PreTrainedTokenizerFast, reference: PreTrainedTokenizerFast
) -> None:
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.unk_token_id) == (
        1,
        2,
        2,
        0,
    )
    assert ours.add_bos_token is False and ours("hi").input_ids == reference("hi").input_ids == [
        6004
    ]
    assert ours.convert_tokens_to_ids("<|im_start|>") == 1
    prompt = ours.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert prompt == reference.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert "You are a helpful AI assistant named SmolLM" in prompt


def test_saved_gguf_tokenizer_reloads_identically(
    ours: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    """The converted cache stores the tokenizer with save_pretrained; a warm load must not differ."""
    ours.save_pretrained(tmp_path)
    reloaded = load_tokenizer(tmp_path)
    for text in TEXTS:
        assert reloaded(text).input_ids == ours(text).input_ids, text
    assert (reloaded.bos_token, reloaded.eos_token, reloaded.pad_token) == (
        ours.bos_token,
        ours.eos_token,
        ours.pad_token,
    )
    assert reloaded.apply_chat_template(MESSAGES, tokenize=False) == ours.apply_chat_template(
        MESSAGES, tokenize=False
    )


@pytest.mark.parametrize("add_bos", [False, True])
def test_tiny_gguf_tokenizer_matches_its_source(tmp_path: Path, add_bos: bool) -> None:
    path = write_tiny_gguf(
        write_tiny_checkpoint(tmp_path), tmp_path / "tiny.gguf", add_bos_token=add_bos
    )
    ours = tokenizer_from_gguf_metadata(read_gguf(path).metadata)
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    source = tiny_tokenizer()
    for text in TEXTS:
        ids = ours(text).input_ids
        assert ids == reference(text).input_ids, text
        assert ids == ([source.bos_token_id] if add_bos else []) + source(text).input_ids, text
    assert ours.chat_template == CHAT_TEMPLATE


def test_hf_directory_tokenizer(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path, "qwen3")
    tok = load_tokenizer(directory)
    assert tok("Hello <|im_end|>").input_ids == tiny_tokenizer()("Hello <|im_end|>").input_ids
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )


def test_directory_without_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)


def test_gguf_without_tokenizer_metadata() -> None:
    with pytest.raises(ValueError, match="no tokenizer"):
        tokenizer_from_gguf_metadata({"general.architecture": "llama"})
