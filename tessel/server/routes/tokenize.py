"""POST /tokenize and /detokenize (vLLM's shapes)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, model_validator

from tessel.server.auth import require_api_key, server_state
from tessel.server.protocol.chat import ChatMessage
from tessel.server.protocol.errors import APIError
from tessel.server.protocol.sampling import check_utf8
from tessel.server.tokens import render_chat

router = APIRouter(dependencies=[Depends(require_api_key)])


class TokenizeRequest(BaseModel):
    """Either ``prompt`` (encoded as completions encode it) or ``messages`` (chat-templated)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True

    @model_validator(mode="before")
    @classmethod
    def _strings_are_utf8(cls, data: Any) -> Any:
        check_utf8(data)
        return data


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[StrictInt]


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    state = server_state(request)
    state.check_model(body.model)
    engine = state.ready_engine()
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", "prompt")
    if body.messages is not None:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        ids = render_chat(engine.tokenizer, messages, None)
    else:
        ids = engine.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    state = server_state(request)
    state.check_model(body.model)
    engine = state.ready_engine()
    for token_id in body.tokens:
        if not 0 <= token_id < engine.vocab_size:
            raise APIError(
                400, f"tokens: token id {token_id} is not in [0, {engine.vocab_size})", "tokens"
            )
    return {"prompt": engine.tokenizer.decode(body.tokens)}
