"""POST /v1/completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from engine.request import CompletionOutput, Logprob, RequestOutput
from server.auth import require_api_key, server_state
from server.generation import Generation
from server.protocol.completion import (
    CompletionRequest,
    completion_body,
    completion_choice,
    completion_logprobs,
)
from server.routes.common import new_request_id, respond, start_generation, usage
from server.tokens import TokenTexts, check_context, encode_prompt

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state = server_state(request)
    state.check_model(body.model)
    body.check_unsupported()
    engine = state.ready_engine()
    params = body.to_sampling_params(engine.vocab_size)
    prompts = body.prompts()

    def encode() -> list[list[int]]:
        encoded = [encode_prompt(engine.tokenizer, p, engine.vocab_size) for p in prompts]
        for ids in encoded:
            check_context(len(ids), params.max_tokens, engine.max_model_len, "max_tokens")
        return encoded

    request_id = new_request_id("cmpl")
    generation = start_generation(state, request_id, params, encode)
    view = CompletionView(
        request_id,
        state.served_model_name,
        prompts,
        generation.prompts,
        params.n,
        body.echo,
        body.logprobs is not None,
        TokenTexts(engine.tokenizer),
    )
    return await respond(
        request,
        generation,
        body.stream,
        lambda: view.stream(generation, body.include_usage),
        lambda: view.collect(generation),
    )


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    text: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    offset: int = 0  # characters of ``text`` already covered by logprobs
    num_tokens: int = 0
    finish_reason: str | None = None


class CompletionView:
    """Turns engine deltas into completion chunks, or accumulates them into one body."""

    def __init__(
        self,
        request_id: str,
        model: str,
        prompts: list[str | list[int]],
        prompt_ids: list[list[int]],
        n: int,
        echo: bool,
        want_logprobs: bool,
        token_text: TokenTexts,
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.prompts = prompts
        self.prompt_ids = prompt_ids
        self.n = n
        self.echo = echo
        self.want_logprobs = want_logprobs
        self.token_text = token_text
        self.choices = [ChoiceState() for _ in range(len(prompts) * n)]
        self.num_prompt_tokens = sum(len(ids) for ids in prompt_ids)
        self._seen_prompts: set[int] = set()

    def _chunk(
        self, choices: list[dict[str, Any]], usage_: dict[str, int] | None = None
    ) -> dict[str, Any]:
        return completion_body(self.request_id, self.created, self.model, choices, usage_)

    def _logprobs(
        self,
        state: ChoiceState,
        tokens: list[str],
        lps: list[float | None],
        tops: list[dict[str, float] | None],
    ) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        part = completion_logprobs(tokens, lps, tops, state.offset)
        state.tokens += tokens
        state.token_logprobs += lps
        state.top_logprobs += tops
        state.offset += sum(len(t) for t in tokens)
        return part

    def _on_prompt(self, prompt_index: int, output: RequestOutput) -> list[dict[str, Any]]:
        """First output of a prompt: count its tokens, and with ``echo``, its text first."""
        self._seen_prompts.add(prompt_index)
        if not self.echo:
            return []
        prompt = self.prompts[prompt_index]
        ids = self.prompt_ids[prompt_index]
        text = prompt if isinstance(prompt, str) else self.token_text.tokenizer.decode(ids)
        entries: list[Logprob | None] = list(output.prompt_logprobs or [None] * len(ids))
        tokens = [self.token_text(i) for i in ids]
        lps = [None if e is None else e.logprob for e in entries]
        tops = [None if e is None else self._top(e) for e in entries]
        parts = []
        for c in range(self.n):
            index = prompt_index * self.n + c
            state = self.choices[index]
            state.text.append(text)
            logprobs = self._logprobs(state, tokens, lps, tops)
            parts.append(completion_choice(index, text, logprobs, None))
        return parts

    def _top(self, entry: Logprob) -> dict[str, float]:
        return {self.token_text(i): lp for i, lp in entry.top}

    def _on_delta(self, prompt_index: int, delta: CompletionOutput) -> dict[str, Any]:
        index = prompt_index * self.n + delta.index
        state = self.choices[index]
        state.text.append(delta.text)
        state.num_tokens += len(delta.token_ids)
        logprobs = None
        if self.want_logprobs:
            entries = delta.logprobs or []
            logprobs = self._logprobs(
                state,
                [self.token_text(e.token_id) for e in entries],
                [e.logprob for e in entries],
                [self._top(e) for e in entries],
            )
        if delta.finish_reason is not None:
            state.finish_reason = delta.finish_reason
        return completion_choice(index, delta.text, logprobs, delta.finish_reason)

    def _parts(self, prompt_index: int, output: RequestOutput) -> list[dict[str, Any]]:
        parts = [] if prompt_index in self._seen_prompts else self._on_prompt(prompt_index, output)
        return parts + [self._on_delta(prompt_index, d) for d in output.outputs]

    def _usage(self) -> dict[str, int]:
        return usage(self.num_prompt_tokens, sum(c.num_tokens for c in self.choices))

    async def stream(
        self, generation: Generation, include_usage: bool
    ) -> AsyncIterator[dict[str, Any]]:
        async with generation:
            async for prompt_index, output in generation:
                for part in self._parts(prompt_index, output):
                    yield self._chunk([part])
        for index, state in enumerate(self.choices):
            if state.finish_reason is None:  # e.g. max_tokens 0: the engine sent no delta
                state.finish_reason = "length"
                yield self._chunk([completion_choice(index, "", None, "length")])
        if include_usage:
            yield self._chunk([], self._usage())

    async def collect(self, generation: Generation) -> dict[str, Any]:
        async with generation:
            async for prompt_index, output in generation:
                self._parts(prompt_index, output)
        choices = []
        for index, state in enumerate(self.choices):
            logprobs = None
            if self.want_logprobs:
                logprobs = completion_logprobs(
                    state.tokens, state.token_logprobs, state.top_logprobs, 0
                )
            choices.append(
                completion_choice(
                    index, "".join(state.text), logprobs, state.finish_reason or "length"
                )
            )
        return self._chunk(choices, self._usage())
