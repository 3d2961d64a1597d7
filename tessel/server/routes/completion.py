"""POST /v1/completions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tessel.engine.request import CompletionOutput, Logprob, RequestOutput
from tessel.server.auth import require_api_key
from tessel.server.protocol.completion import (
    CompletionRequest,
    completion_choice,
    completion_logprobs,
)
from tessel.server.protocol.response import COMPLETION
from tessel.server.routes.common import ResponseView, open_request, respond, start_generation
from tessel.server.tokens import TokenTexts, check_context, encode_prompt

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    prompts = body.prompts()
    state, engine, params = open_request(request, body, len(prompts))

    def encode() -> list[list[int]]:
        encoded = [encode_prompt(engine.tokenizer, p, engine.vocab_size) for p in prompts]
        for ids in encoded:
            check_context(len(ids), params.max_tokens, engine.max_model_len, "max_tokens")
        return encoded

    generation = start_generation(state, "cmpl", params, body, encode)
    view = CompletionView(
        generation.request_id,
        state.served_model_name,
        prompts,
        generation.prompts,
        params.n,
        body.echo,
        body.logprobs is not None,
        TokenTexts(engine.tokenizer),
    )
    return await respond(request, generation, view, body)


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    text: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    offset: int = 0  # characters of ``text`` already covered by logprobs


class CompletionView(ResponseView):
    """Completion chunks (the echoed prompt first), or one completion body."""

    chunk_kind = COMPLETION
    body_kind = COMPLETION

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
        num_prompt_tokens = sum(len(ids) for ids in prompt_ids)
        super().__init__(request_id, model, num_prompt_tokens, len(prompts) * n)
        self.prompts = prompts
        self.prompt_ids = prompt_ids
        self.n = n
        self.echo = echo
        self.want_logprobs = want_logprobs
        self.token_text = token_text
        self.choices = [ChoiceState() for _ in range(len(prompts) * n)]
        self._seen_prompts: set[int] = set()

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
        """First output of a prompt: with ``echo``, its text (and prompt logprobs) first."""
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
        self.record(index, delta)
        state = self.choices[index]
        state.text.append(delta.text)
        logprobs = None
        if self.want_logprobs:
            entries = delta.logprobs or []
            logprobs = self._logprobs(
                state,
                [self.token_text(e.token_id) for e in entries],
                [e.logprob for e in entries],
                [self._top(e) for e in entries],
            )
        return completion_choice(index, delta.text, logprobs, delta.finish_reason)

    def parts(self, prompt_index: int, output: RequestOutput) -> list[dict[str, Any]]:
        parts = [] if prompt_index in self._seen_prompts else self._on_prompt(prompt_index, output)
        return parts + [self._on_delta(prompt_index, d) for d in output.outputs]

    def closing_part(self, index: int, reason: str) -> dict[str, Any]:
        return completion_choice(index, "", None, reason)

    def output_text(self, index: int) -> str:
        return "".join(self.choices[index].text)

    def body_choice(self, index: int, reason: str) -> dict[str, Any]:
        state = self.choices[index]
        logprobs = None
        if self.want_logprobs:
            logprobs = completion_logprobs(
                state.tokens, state.token_logprobs, state.top_logprobs, 0
            )
        return completion_choice(index, self.output_text(index), logprobs, reason)
