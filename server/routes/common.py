"""What the two generation routes share: admission, the request id, the usage object."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from engine.sampling_params import SamplingParams
from server.generation import Generation
from server.protocol.errors import APIError
from server.state import ServerState
from server.streaming import CLIENT_CLOSED, ClientDisconnected, sse_response, unless_disconnected


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(num_prompt: int, num_completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }


def start_generation(
    state: ServerState,
    request_id: str,
    params: SamplingParams,
    encode: Callable[[], list[list[int]]],
) -> Generation:
    """Admit the request (429/503 before any tokenizing), then encode its prompts."""
    engine = state.ready_engine()
    ticket = state.admit()
    try:
        prompts = encode()
    except BaseException:
        ticket.close()
        raise
    return Generation(engine, state.metrics, ticket, request_id, prompts, params)


async def respond(
    request: Request,
    generation: Generation,
    stream: bool,
    chunks: Callable[[], AsyncIterator[dict[str, Any]]],
    body: Callable[[], Awaitable[dict[str, Any]]],
) -> Response:
    """SSE of ``chunks()`` or JSON of ``body()``; a vanished client aborts either way."""
    if stream:
        # The background close covers a client gone before the stream's first step.
        response = sse_response(chunks())
        response.background = BackgroundTask(generation.close)
        return response
    try:
        return JSONResponse(await unless_disconnected(request, body()))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    except ValueError as err:  # the engine refused the prompt (its message names the numbers)
        raise APIError(400, str(err), param=getattr(err, "param", None)) from err
    finally:
        await generation.close()
