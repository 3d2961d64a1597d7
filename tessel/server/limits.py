"""What one request may ask for: body size (an ASGI middleware), prompt count, n, max_tokens
and stop strings (checked before anything is tokenized)."""

from __future__ import annotations

import json
from typing import Protocol

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tessel.server.protocol.errors import APIError, error_body
from tessel.server.settings import ServerSettings


class BodySizeLimit:
    """413 for a body over ``max_bytes``: at once from ``Content-Length``, or while a chunked
    body is read (the route's body read then raises, before any JSON parsing)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return f"the request body is larger than the limit of {self.max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _send_413(send, self._message())
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_413(send: Send, message: str) -> None:
    body = json.dumps(error_body(413, message, code="request_too_large")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class LimitedBody(Protocol):
    """What ``check_limits`` reads of a completions or chat request body."""

    n: int | None

    @property
    def stop_strings(self) -> list[str]: ...

    def requested_max_tokens(self) -> tuple[int | None, str]: ...


def check_limits(body: LimitedBody, settings: ServerSettings, num_prompts: int = 1) -> None:
    """400 naming the field when the request asks for more than the server allows."""
    if num_prompts > settings.max_prompts:
        raise APIError(
            400,
            f"prompt: at most {settings.max_prompts} prompts per request, got {num_prompts}",
            "prompt",
        )
    if body.n is not None and body.n > settings.max_n:
        raise APIError(400, f"n must be <= {settings.max_n}, got {body.n}", "n")
    max_tokens, param = body.requested_max_tokens()
    limit = settings.max_tokens_limit
    if limit is not None and max_tokens is not None and max_tokens > limit:
        raise APIError(400, f"{param} must be <= {limit}, got {max_tokens}", param)
    stops = body.stop_strings
    if len(stops) > settings.max_stop_strings:
        raise APIError(
            400, f"stop: at most {settings.max_stop_strings} strings, got {len(stops)}", "stop"
        )
    longest = max((len(s) for s in stops), default=0)
    if longest > settings.max_stop_string_chars:
        raise APIError(
            400,
            f"stop: strings must be at most {settings.max_stop_string_chars} characters, "
            f"got one of {longest}",
            "stop",
        )


def effective_timeout(requested: float | None, settings: ServerSettings) -> float | None:
    """The request's own ``timeout``, never longer than the server's ``request_timeout_s``."""
    limits = [t for t in (requested, settings.request_timeout_s) if t is not None]
    return min(limits) if limits else None
