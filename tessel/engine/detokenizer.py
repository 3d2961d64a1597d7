"""Incremental detokenization: one request's output ids to text deltas, O(1) work per token."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens decoded in front of the output, so the first output token is decoded in
# context (e.g. keeps the leading space a Metaspace decoder strips from a sequence's start).
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """vLLM's prefix/read-offset algorithm over a sliding window of ids.

    Each step decodes ``ids[prefix:]`` and ``ids[prefix:read]`` and emits the difference, so
    a decoder's behaviour at a sequence's start is the same on both sides. Text ending in
    U+FFFD (a UTF-8 sequence split across tokens) is held until the next token completes it,
    so deltas never carry a broken character; ``flush`` releases what is held at the end.
    Without a prompt, the deltas join to ``tokenizer.decode(output_ids, skip_special_tokens=...,
    clean_up_tokenization_spaces=False)``.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        skip_special_tokens: bool = True,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> None:
        self._backend = tokenizer.backend_tokenizer  # the Rust tokenizer: no Python-side cleanup
        self._skip = skip_special_tokens
        context = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_token_ids else []
        if context and self._decode(context).endswith(REPLACEMENT_CHAR):
            context = []  # a prompt ending mid-character would make the first diff wrong
        self._ids: list[int] = context  # the window, starting at the prefix offset
        self._read_offset = len(context)  # ids before it are already emitted as text

    def step(self, token_ids: Sequence[int]) -> str:
        """Append new ids; return the text they complete ("" while a character is split)."""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Release text still held (a trailing incomplete character); call once at finish."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        ids, read = self._ids, self._read_offset
        decode, skip = self._backend.decode, self._skip  # per token per request: kept local
        prefix_text = decode(ids[:read], skip_special_tokens=skip) if read else ""
        text = decode(ids, skip_special_tokens=skip) if ids else ""
        if len(text) <= len(prefix_text) or (not final and text.endswith(REPLACEMENT_CHAR)):
            return ""
        # Slide the window: the newly read ids become the next step's prefix.
        del self._ids[: self._read_offset]
        self._read_offset = len(self._ids)
        return text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        return self._backend.decode(ids, skip_special_tokens=self._skip) if ids else ""
