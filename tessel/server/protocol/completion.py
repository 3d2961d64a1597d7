"""/v1/completions: the request body and the JSON it answers with."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr

from tessel.engine.sampling_params import SamplingParams
from tessel.server.protocol.errors import APIError
from tessel.server.protocol.sampling import SamplingRequest, estimate_tokens

PromptInput = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class CompletionRequest(SamplingRequest):
    """OpenAI's legacy completions request, plus the sampling extensions."""

    prompt: PromptInput
    max_tokens: int | None = Field(default=16)
    """OpenAI's default is 16; ``null`` means up to the context limit."""
    echo: StrictBool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def check_unsupported(self) -> None:
        """Fields we accept in the schema but cannot honour: a 400 naming them, not silence."""
        self.check_stream_options()
        if self.suffix is not None:
            raise APIError(400, "suffix is not supported", "suffix")
        n = self.n or 1
        if self.best_of is not None and self.best_of != n:
            raise APIError(400, f"best_of must equal n ({n}); got {self.best_of}", "best_of")

    def requested_max_tokens(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"

    def estimated_prompt_tokens(self) -> int:
        """Prompt tokens, estimated without tokenizing (exact for token ids)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return estimate_tokens(prompt)
        return sum(
            estimate_tokens(p) if isinstance(p, str) else len(p) if isinstance(p, list) else 1
            for p in prompt
        )

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request: one string or token-id list each."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise APIError(400, "prompt must not be empty", "prompt")
        if isinstance(prompt[0], int):
            return [list(prompt)]  # type: ignore[arg-type]
        items: list[str | list[int]] = list(prompt)  # type: ignore[arg-type]
        return items

    def to_sampling_params(self, vocab_size: int) -> SamplingParams:
        return self.sampling_params(
            vocab_size,
            max_tokens=self.max_tokens,
            logprobs=self.logprobs,
            prompt_logprobs=self.logprobs if self.echo and self.logprobs is not None else None,
        )


def completion_logprobs(
    tokens: list[str],
    token_logprobs: list[float | None],
    top_logprobs: list[dict[str, float] | None],
    start_offset: int,
) -> dict[str, Any]:
    """The legacy ``logprobs`` object; ``text_offset`` counts characters from ``start_offset``."""
    offsets = []
    offset = start_offset
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def completion_choice(
    index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }
