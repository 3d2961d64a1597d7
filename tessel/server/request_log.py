"""Request ids in every log line, and the one line each generation request logs.

Each HTTP request gets an id (the client's ``X-Request-Id`` when it is a sane token, else a
new one), kept in a context variable that every log record reads, so a line logged anywhere
while the request is served (route, streaming, background close) carries it. The id is sent
back in ``X-Request-Id``. Prompts and outputs appear in the log only with ``log_prompts``.
"""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID: ContextVar[str] = ContextVar("tessel_request_id", default="-")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

log = logging.getLogger("tessel.requests")


def install_request_ids() -> None:
    """Give every log record a ``request_id`` attribute ("-" outside a request); idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "tessel_request_ids", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.request_id = REQUEST_ID.get()
        return record

    factory.tessel_request_ids = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def configure_logging(level: str) -> None:
    """Root logging for ``tessel serve``: one format with the request id, for every logger."""
    install_request_ids()
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)


class RequestIdMiddleware:
    """Sets ``REQUEST_ID`` for the request and answers it in the ``X-Request-Id`` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers", [])).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _SANE_ID.fullmatch(given) else f"req-{uuid.uuid4().hex[:16]}"
        token = REQUEST_ID.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append("x-request-id", request_id)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)


def log_generation(
    route: str,
    response_id: str,
    num_prompt_tokens: int,
    num_generated: int,
    finish_reasons: list[str | None],
    seconds: float,
    prompts: list[str] | None = None,
    outputs: list[str] | None = None,
) -> None:
    """One INFO line per generation request: counts and timing; texts only when given."""
    reasons = ",".join(sorted({r or "none" for r in finish_reasons}))
    line = (
        f"{route} {response_id}: {num_prompt_tokens} prompt + {num_generated} generated "
        f"tokens, finish {reasons}, {seconds:.3f} s"
    )
    if prompts is not None:
        line += f"; prompts {prompts!r}; outputs {outputs!r}"
    log.info(line)
