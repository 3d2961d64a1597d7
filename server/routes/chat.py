"""POST /v1/chat/completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from engine.request import CompletionOutput
from server.auth import require_api_key, server_state
from server.generation import Generation
from server.protocol.chat import ChatCompletionRequest, chat_body, chat_chunk, chat_logprob_entry
from server.routes.common import new_request_id, respond, start_generation, usage
from server.tokens import TokenTexts, check_context, render_chat

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state = server_state(request)
    state.check_model(body.model)
    body.check_unsupported()
    engine = state.ready_engine()
    params = body.to_sampling_params(engine.vocab_size)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"

    def encode() -> list[list[int]]:
        ids = render_chat(engine.tokenizer, body.template_messages(), body.chat_template_kwargs)
        check_context(len(ids), params.max_tokens, engine.max_model_len, param)
        return [ids]

    request_id = new_request_id("chatcmpl")
    generation = start_generation(state, request_id, params, encode)
    view = ChatView(
        request_id,
        state.served_model_name,
        len(generation.prompts[0]),
        params.n,
        body.logprobs,
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
class ChatChoice:
    """What one choice has produced so far."""

    content: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    num_tokens: int = 0
    finish_reason: str | None = None


class ChatView:
    """Turns engine deltas into chat chunks (role first, then content), or one body."""

    def __init__(
        self,
        request_id: str,
        model: str,
        num_prompt_tokens: int,
        n: int,
        want_logprobs: bool,
        token_text: TokenTexts,
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.num_prompt_tokens = num_prompt_tokens
        self.want_logprobs = want_logprobs
        self.token_text = token_text
        self.choices = [ChatChoice() for _ in range(n)]

    def _chunk(
        self, choices: list[dict[str, Any]], usage_: dict[str, int] | None = None
    ) -> dict[str, Any]:
        return chat_chunk(self.request_id, self.created, self.model, choices, usage_)

    def _usage(self) -> dict[str, int]:
        return usage(self.num_prompt_tokens, sum(c.num_tokens for c in self.choices))

    def _on_delta(self, delta: CompletionOutput) -> tuple[ChatChoice, list[dict[str, Any]]]:
        choice = self.choices[delta.index]
        choice.content.append(delta.text)
        choice.num_tokens += len(delta.token_ids)
        entries = []
        if self.want_logprobs:
            for e in delta.logprobs or []:
                top = [(self.token_text(i), lp) for i, lp in e.top]
                entries.append(chat_logprob_entry(self.token_text(e.token_id), e.logprob, top))
            choice.logprobs += entries
        if delta.finish_reason is not None:
            choice.finish_reason = delta.finish_reason
        return choice, entries

    async def stream(
        self, generation: Generation, include_usage: bool
    ) -> AsyncIterator[dict[str, Any]]:
        for index in range(len(self.choices)):
            role = {"role": "assistant", "content": ""}
            yield self._chunk(
                [{"index": index, "delta": role, "logprobs": None, "finish_reason": None}]
            )
        async with generation:
            async for _, output in generation:
                for delta in output.outputs:
                    _, entries = self._on_delta(delta)
                    if not (delta.text or entries or delta.finish_reason):
                        continue  # nothing visible yet (e.g. half of a UTF-8 character)
                    yield self._chunk(
                        [
                            {
                                "index": delta.index,
                                "delta": {"content": delta.text} if delta.text else {},
                                "logprobs": {"content": entries} if self.want_logprobs else None,
                                "finish_reason": delta.finish_reason,
                            }
                        ]
                    )
        for index, choice in enumerate(self.choices):
            if choice.finish_reason is None:
                choice.finish_reason = "length"
                yield self._chunk(
                    [{"index": index, "delta": {}, "logprobs": None, "finish_reason": "length"}]
                )
        if include_usage:
            yield self._chunk([], self._usage())

    async def collect(self, generation: Generation) -> dict[str, Any]:
        async with generation:
            async for _, output in generation:
                for delta in output.outputs:
                    self._on_delta(delta)
        choices = [
            {
                "index": index,
                "message": {"role": "assistant", "content": "".join(choice.content)},
                "logprobs": {"content": choice.logprobs} if self.want_logprobs else None,
                "finish_reason": choice.finish_reason or "length",
            }
            for index, choice in enumerate(self.choices)
        ]
        return chat_body(self.request_id, self.created, self.model, choices, self._usage())
