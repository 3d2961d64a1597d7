"""What the two generation routes share: opening a request, admission, and the response frame.

A route checks its body, encodes its prompts inside ``start_generation`` (after admission, so
a full queue costs no tokenizing), and hands a ``ResponseView`` to ``respond``. The view's
subclass says how one engine delta becomes a choice entry; ``ResponseView`` owns the rest:
the envelope, the closing chunk for choices the engine ended silently, and the usage.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from tessel.engine.request import CompletionOutput, RequestOutput
from tessel.engine.sampling_params import SamplingParams
from tessel.server.auth import server_state
from tessel.server.generation import Generation, GenerationFailed
from tessel.server.limits import check_limits, effective_timeout
from tessel.server.protocol.errors import APIError
from tessel.server.protocol.response import response_body, usage_body
from tessel.server.request_log import log_generation
from tessel.server.state import ServerState
from tessel.server.streaming import (
    CLIENT_CLOSED,
    ClientDisconnected,
    sse_response,
    unless_disconnected,
)

if TYPE_CHECKING:
    from tessel.engine import AsyncEngine


class GenerationBody(Protocol):
    """What ``open_request`` needs of a completions or chat request body."""

    model: str | None
    n: int | None
    stream: bool
    timeout: float | None

    @property
    def include_usage(self) -> bool: ...

    @property
    def stop_strings(self) -> list[str]: ...

    def check_unsupported(self) -> None: ...

    def requested_max_tokens(self) -> tuple[int | None, str]: ...

    def estimated_prompt_tokens(self) -> int: ...

    def to_sampling_params(self, vocab_size: int) -> SamplingParams: ...


def open_request(
    request: Request, body: GenerationBody, num_prompts: int = 1
) -> tuple[ServerState, AsyncEngine, SamplingParams]:
    """The checks every generation route makes first: model name, unsupported fields, the
    server's limits, readiness, sampling ranges (each a 4xx/503 naming its field)."""
    state = server_state(request)
    state.check_model(body.model)
    body.check_unsupported()
    check_limits(body, state.settings, num_prompts)
    engine = state.ready_engine()
    return state, engine, body.to_sampling_params(engine.vocab_size)


def start_generation(
    state: ServerState,
    id_prefix: str,
    params: SamplingParams,
    body: GenerationBody,
    encode: Callable[[], list[list[int]]],
) -> Generation:
    """Admit the request (429/503 before any tokenizing or templating, on the body's
    estimated prompt tokens), then encode its prompts."""
    engine = state.ready_engine()
    ticket = state.admit(body.estimated_prompt_tokens())
    try:
        prompts = encode()
        ticket.set_tokens(sum(len(ids) for ids in prompts))
    except BaseException:
        ticket.close()
        raise
    limit = state.settings.max_tokens_limit
    if limit is not None and params.max_tokens is None:  # null: up to the context, capped
        room = engine.max_model_len - max(len(ids) for ids in prompts)
        params = replace(params, max_tokens=min(limit, room))
    request_id = f"{id_prefix}-{uuid.uuid4().hex}"
    timeout_s = effective_timeout(body.timeout, state.settings)
    return Generation(engine, state.metrics, ticket, request_id, prompts, params, timeout_s)


class ResponseView(ABC):
    """Turns a ``Generation``'s deltas into stream chunks, or accumulates them into one body."""

    chunk_kind: str  # ``object`` of a stream chunk
    body_kind: str  # ``object`` of the whole body

    def __init__(self, request_id: str, model: str, num_prompt_tokens: int, num_choices: int):
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.num_prompt_tokens = num_prompt_tokens
        self.num_tokens = [0] * num_choices
        self.finish_reasons: list[str | None] = [None] * num_choices

    # ---- what a subclass says ------------------------------------------------------------

    def opening_parts(self) -> list[dict[str, Any]]:
        """Choice entries streamed before any token (chat: each choice's role)."""
        return []

    @abstractmethod
    def parts(self, prompt_index: int, output: RequestOutput) -> list[dict[str, Any]]:
        """One engine output's choice entries for the stream; also accumulates the body."""

    @abstractmethod
    def closing_part(self, index: int, reason: str) -> dict[str, Any]:
        """An empty choice entry that ends choice ``index`` with ``reason``."""

    @abstractmethod
    def body_choice(self, index: int, reason: str) -> dict[str, Any]:
        """Choice ``index`` of the non-streamed body."""

    @abstractmethod
    def output_text(self, index: int) -> str:
        """Choice ``index``'s text so far (for the log, with ``log_prompts``)."""

    # ---- the shared frame ----------------------------------------------------------------

    def record(self, index: int, delta: CompletionOutput) -> None:
        """Count a delta's tokens against choice ``index`` and keep its finish reason."""
        self.num_tokens[index] += len(delta.token_ids)
        if delta.finish_reason is not None:
            self.finish_reasons[index] = delta.finish_reason

    def usage(self) -> dict[str, int]:
        return usage_body(self.num_prompt_tokens, sum(self.num_tokens))

    def chunk(
        self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None
    ) -> dict[str, Any]:
        return response_body(
            self.chunk_kind, self.request_id, self.created, self.model, choices, usage
        )

    async def stream(
        self, generation: Generation, include_usage: bool
    ) -> AsyncIterator[dict[str, Any]]:
        for part in self.opening_parts():
            yield self.chunk([part])
        try:
            async with generation:
                async for prompt_index, output in generation:
                    for part in self.parts(prompt_index, output):
                        yield self.chunk([part])
        except GenerationFailed as err:  # each open choice ends, then the error event
            for part in self._close_open(err.finish_reason):
                yield self.chunk([part])
            raise
        for part in self._close_open("length"):  # e.g. max_tokens 0: no delta for it
            yield self.chunk([part])
        if include_usage:
            yield self.chunk([], self.usage())

    def _close_open(self, reason: str) -> list[dict[str, Any]]:
        parts = []
        for index, current in enumerate(self.finish_reasons):
            if current is None:
                self.finish_reasons[index] = reason
                parts.append(self.closing_part(index, reason))
        return parts

    async def collect(self, generation: Generation) -> dict[str, Any]:
        async with generation:
            async for prompt_index, output in generation:
                self.parts(prompt_index, output)
        choices = [
            self.body_choice(index, reason or "length")
            for index, reason in enumerate(self.finish_reasons)
        ]
        return response_body(
            self.body_kind, self.request_id, self.created, self.model, choices, self.usage()
        )


async def respond(
    request: Request, generation: Generation, view: ResponseView, body: GenerationBody
) -> Response:
    """SSE of the view's chunks or JSON of its body; a vanished client aborts either way."""
    state = server_state(request)

    async def finish() -> None:
        await generation.close()
        _log(state, request.url.path, generation, view)

    if body.stream:
        # The background close covers a client gone before the stream's first step.
        response = sse_response(view.stream(generation, body.include_usage))
        response.background = BackgroundTask(finish)
        return response
    try:
        return JSONResponse(await unless_disconnected(request, view.collect(generation)))
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    except ValueError as err:  # the engine refused the prompt (its message names the numbers)
        raise APIError(400, str(err), param=getattr(err, "param", None)) from err
    finally:
        await finish()


def _log(state: ServerState, route: str, generation: Generation, view: ResponseView) -> None:
    prompts = outputs = None
    if state.settings.log_prompts:
        prompts = [str(generation.engine.tokenizer.decode(ids)) for ids in generation.prompts]
        outputs = [view.output_text(i) for i in range(len(view.finish_reasons))]
    log_generation(
        route,
        generation.request_id,
        view.num_prompt_tokens,
        sum(view.num_tokens),
        [reason for run in generation.runs for reason in run.reasons.values()],
        time.monotonic() - generation.started_at,
        prompts,
        outputs,
    )
