"""Server-sent events, and aborting a request whose client has gone.

Streaming: Starlette cancels the body iterator when the client disconnects; the
``Generation`` it iterates then aborts its engine requests. Non-streaming: the route's work
runs beside a task that waits for ``http.disconnect``, and whichever ends first wins.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from tessel.server.protocol.errors import APIError, error_body

log = logging.getLogger("tessel.server")
T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's status for "client closed request"; never reaches the client


class ClientDisconnected(Exception):
    """The client went away before the response was ready."""


def sse_frame(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


async def sse_events(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """``data: <json>`` per chunk, ``data: [DONE]`` last; a failure becomes an error frame."""
    try:
        async for chunk in chunks:
            yield sse_frame(chunk)
    except APIError as err:
        yield sse_frame(error_body(err.status, err.message, err.param, err.code))
    except ValueError as err:
        yield sse_frame(error_body(400, str(err)))
    except Exception as err:
        log.exception("stream failed")
        yield sse_frame(error_body(500, f"internal error: {type(err).__name__}: {err}"))
    yield sse_frame("[DONE]")


def sse_response(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    return StreamingResponse(
        sse_events(chunks),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body was already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run ``work``; if the client disconnects first, cancel it (aborting its requests)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler itself was cancelled: take the work down with it
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientDisconnected
