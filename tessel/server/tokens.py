"""Prompt encoding, chat templating and token texts, shared by every route."""

from __future__ import annotations

from typing import Any

from tessel.server.protocol.errors import APIError


def encode_prompt(tokenizer: Any, prompt: str | list[int], vocab_size: int) -> list[int]:
    """A prompt's token ids, encoded exactly as the offline ``engine.LLM`` encodes a string."""
    if isinstance(prompt, str):
        ids: list[int] = tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        for token_id in ids:
            if not 0 <= token_id < vocab_size:
                raise APIError(
                    400, f"prompt: token id {token_id} is not in [0, {vocab_size})", "prompt"
                )
    if not ids:
        raise APIError(400, "prompt must contain at least one token", "prompt")
    return ids


def render_chat(
    tokenizer: Any, messages: list[dict[str, str]], kwargs: dict[str, Any] | None
) -> list[int]:
    """The chat template applied with ``add_generation_prompt``, as token ids."""
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **(kwargs or {})
        )
    except Exception as err:  # a template may raise on a role order it does not allow
        raise APIError(400, f"messages: the chat template failed: {err}", "messages") from err
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


def check_context(num_prompt: int, max_tokens: int | None, max_model_len: int, param: str) -> None:
    """400 naming both numbers when prompt + max_tokens exceeds the context."""
    wanted = num_prompt + (1 if max_tokens is None else max_tokens)  # None: at least one
    if wanted > max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {wanted} tokens ({num_prompt} in the prompt, {wanted - num_prompt} for the "
            f"completion). Please reduce the prompt or {param}.",
            param,
            code="context_length_exceeded",
        )


class TokenTexts:
    """Token id -> its text as logprobs show it (special tokens kept), cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text
