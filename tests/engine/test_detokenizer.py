"""The incremental detokenizer against the tokenizer's own full decode."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tessel.engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from tests.engine.tiny_tokenizer import CORPUS, tiny_tokenizer


def stream(detok: IncrementalDetokenizer, ids: list[int], chunk: int = 1) -> list[str]:
    deltas = [detok.step(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return deltas + [detok.flush()]


@pytest.mark.parametrize("skip_special", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_random_streams_join_to_full_decode(skip_special: bool, seed: int) -> None:
    tok = tiny_tokenizer()
    rng = random.Random(seed)
    ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 80))]
    deltas = stream(IncrementalDetokenizer(tok, skip_special), ids, chunk=rng.choice([1, 1, 3]))
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip_special)


@pytest.mark.parametrize("text", CORPUS + ["🇫🇷👍🏽 ünïcödé 日本", "a<|eos|>b<|stop|>c 😀"])
@pytest.mark.parametrize("skip_special", [True, False])
def test_real_text_streams_without_broken_characters(text: str, skip_special: bool) -> None:
    tok = tiny_tokenizer()
    ids = tok.encode(text)
    # The tokenizer really splits characters: some single tokens decode to U+FFFD.
    deltas = stream(IncrementalDetokenizer(tok, skip_special), ids)
    full = tok.decode(ids, skip_special_tokens=skip_special)
    assert "".join(deltas) == full
    assert REPLACEMENT_CHAR not in full
    assert all(REPLACEMENT_CHAR not in d for d in deltas)


def test_tiny_tokenizer_splits_multibyte_characters() -> None:
    tok = tiny_tokenizer()
    pieces = [tok.decode([i]) for i in tok.encode("😀🎉 日本語")]
    assert any(REPLACEMENT_CHAR in p for p in pieces)  # else the tests above prove nothing


def test_prompt_context_continues_the_prompt_text() -> None:
    tok = tiny_tokenizer()
    prompt, output = tok.encode("Héllo wörld, "), tok.encode("ça va? 😀 日本語")
    deltas = stream(IncrementalDetokenizer(tok, True, prompt), output)
    assert "".join(deltas) == tok.decode(prompt + output)[len(tok.decode(prompt)) :]
    assert all(REPLACEMENT_CHAR not in d for d in deltas)


def test_window_stays_small() -> None:
    tok = tiny_tokenizer()
    detok = IncrementalDetokenizer(tok)
    sizes = []
    for token in tok.encode(" ".join(CORPUS) * 5):
        detok.step([token])
        sizes.append(len(detok._ids))
    # It grows only while token boundaries keep falling inside characters (emoji runs).
    assert max(sizes) <= 16 and sum(sizes) / len(sizes) < 4


def _metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece-style: the decoder strips the space at a sequence's start."""
    vocab = {"<unk>": 0, "</s>": 1, "▁Hello": 2, "▁world": 3, "▁again": 4, "!": 5, "▁": 6}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def test_metaspace_spaces_between_and_after_prompt() -> None:
    tok = _metaspace_tokenizer()
    output = [3, 4, 5, 1, 3]
    assert "".join(stream(IncrementalDetokenizer(tok, True), output)) == tok.decode(
        output, skip_special_tokens=True
    )
    with_prompt = "".join(stream(IncrementalDetokenizer(tok, True, [2]), output))
    assert with_prompt == " world again! world"  # the first output word keeps its space
