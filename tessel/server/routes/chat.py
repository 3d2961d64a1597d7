"""POST /v1/chat/completions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tessel.engine.request import RequestOutput
from tessel.server.auth import require_api_key
from tessel.server.protocol.chat import ChatCompletionRequest, chat_logprob_entry
from tessel.server.protocol.response import CHAT_COMPLETION, CHAT_COMPLETION_CHUNK
from tessel.server.routes.common import ResponseView, open_request, respond, start_generation
from tessel.server.tokens import TokenTexts, check_context, render_chat

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state, engine, params = open_request(request, body)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"

    def encode() -> list[list[int]]:
        ids = render_chat(engine.tokenizer, body.template_messages(), body.chat_template_kwargs)
        check_context(len(ids), params.max_tokens, engine.max_model_len, param)
        return [ids]

    generation = start_generation(state, "chatcmpl", params, body, encode)
    view = ChatView(
        generation.request_id,
        state.served_model_name,
        len(generation.prompts[0]),
        params.n,
        body.logprobs,
        TokenTexts(engine.tokenizer),
    )
    return await respond(request, generation, view, body)


@dataclass
class ChatChoice:
    """What one choice has produced so far."""

    content: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


class ChatView(ResponseView):
    """Chat chunks (each choice's role first, then its content), or one chat body."""

    chunk_kind = CHAT_COMPLETION_CHUNK
    body_kind = CHAT_COMPLETION

    def __init__(
        self,
        request_id: str,
        model: str,
        num_prompt_tokens: int,
        n: int,
        want_logprobs: bool,
        token_text: TokenTexts,
    ) -> None:
        super().__init__(request_id, model, num_prompt_tokens, n)
        self.want_logprobs = want_logprobs
        self.token_text = token_text
        self.choices = [ChatChoice() for _ in range(n)]

    def opening_parts(self) -> list[dict[str, Any]]:
        role = {"role": "assistant", "content": ""}
        return [
            {"index": index, "delta": role, "logprobs": None, "finish_reason": None}
            for index in range(len(self.choices))
        ]

    def parts(self, prompt_index: int, output: RequestOutput) -> list[dict[str, Any]]:
        parts = []
        for delta in output.outputs:
            self.record(delta.index, delta)
            choice = self.choices[delta.index]
            choice.content.append(delta.text)
            entries = []
            if self.want_logprobs:
                for e in delta.logprobs or []:
                    top = [(self.token_text(i), lp) for i, lp in e.top]
                    entries.append(chat_logprob_entry(self.token_text(e.token_id), e.logprob, top))
                choice.logprobs += entries
            if not (delta.text or entries or delta.finish_reason):
                continue  # nothing visible yet (e.g. half of a UTF-8 character)
            parts.append(
                {
                    "index": delta.index,
                    "delta": {"content": delta.text} if delta.text else {},
                    "logprobs": {"content": entries} if self.want_logprobs else None,
                    "finish_reason": delta.finish_reason,
                }
            )
        return parts

    def closing_part(self, index: int, reason: str) -> dict[str, Any]:
        return {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}

    def output_text(self, index: int) -> str:
        return "".join(self.choices[index].content)

    def body_choice(self, index: int, reason: str) -> dict[str, Any]:
        choice = self.choices[index]
        return {
            "index": index,
            "message": {"role": "assistant", "content": self.output_text(index)},
            "logprobs": {"content": choice.logprobs} if self.want_logprobs else None,
            "finish_reason": reason,
        }
