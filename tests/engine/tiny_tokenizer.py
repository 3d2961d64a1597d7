"""A byte-level BPE trained in milliseconds on multilingual text, so tokens split UTF-8
characters the way real tokenizers do; no download, no dependency on the model loader."""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS, PAD, STOP = "<|eos|>", "<|pad|>", "<|stop|>"
CORPUS = [
    "Hello world! Héllo wörld, ça va? naïve café — “quotes” and ‘single’ ones.",
    "日本語のテキストです。中文字符测试。ひらがな カタカナ 한국어 텍스트.",
    "emoji 😀🎉👍🏽🇫🇷 mixed with ascii: the quick brown fox jumps over the lazy dog.",
    "Stop here. END of text. ### Next section\n\nNew line and tabs\tok.",
]


@lru_cache(maxsize=1)
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Vocab of 400: 256 bytes + 3 specials + merges, small enough that most non-ASCII
    characters are split over several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[EOS, PAD, STOP],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 10, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[STOP],
        clean_up_tokenization_spaces=False,
    )
