"""A client that goes away, streaming or not, aborts its request at once and frees its KV.

These drive the ASGI app by hand, so the test decides when ``http.disconnect`` arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import FastAPI

from tessel.engine import AsyncEngine
from tests.server.conftest import serving, wait_until_idle

pytestmark = pytest.mark.asyncio(loop_scope="session")

LONG = {
    "prompt": "Write a long story about a dragon.",
    "max_tokens": 400,
    "ignore_eos": True,
    "temperature": 0,
}


async def call_then_leave(
    app: FastAPI, path: str, body: dict[str, Any], leave: Callable[[list[bytes]], bool]
) -> list[bytes]:
    """POST ``body``; once ``leave(body chunks so far)`` is true, the client disconnects."""
    sent: list[bytes] = []
    changed = asyncio.Event()
    payload = json.dumps(body).encode()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": payload, "more_body": False}
        while not leave(sent):
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    changed.wait(), timeout=0.02
                )  # also poll: leave() may watch the engine
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message.get("body", b""))
        changed.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"tessel")],
        "client": ("127.0.0.1", 1234),
        "server": ("tessel", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=60)
    return sent


def finished_count(app: FastAPI, reason: str) -> float:
    value = app.state.tessel.metrics.registry.get_sample_value(
        "tessel_requests_finished_total",
        {"model_name": app.state.tessel.served_model_name, "finished_reason": reason},
    )
    return value or 0.0


async def test_non_streaming_client_gone_aborts(
    make_app: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    app = make_app()
    async with serving(app):
        start = time.monotonic()

        def running(_: list[bytes]) -> bool:
            return engine.stats().num_running > 0

        await call_then_leave(app, "/v1/completions", LONG, running)
        await wait_until_idle(engine, timeout_s=10)
        assert time.monotonic() - start < 30, "the request ran to its end instead of being aborted"
        assert finished_count(app, "abort") == 1
        assert app.state.tessel.num_in_flight == 0


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_streaming_client_gone_aborts(
    make_app: Callable[..., FastAPI], engine: AsyncEngine, path: str
) -> None:
    app = make_app()
    body = {**LONG, "stream": True}
    if "chat" in path:
        body = {**body, "messages": [{"role": "user", "content": body.pop("prompt")}]}
    async with serving(app):
        chunks = await call_then_leave(app, path, body, lambda sent: len(sent) >= 4)
        await wait_until_idle(engine, timeout_s=10)
        assert b"[DONE]" not in b"".join(chunks)
        assert finished_count(app, "abort") == 1
        assert app.state.tessel.num_in_flight == 0 and app.state.tessel.num_queued == 0


async def test_many_prompts_all_abort(
    make_app: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    app = make_app()
    body = {**LONG, "prompt": ["One", "Two", "Three"], "n": 2}
    async with serving(app):
        await call_then_leave(
            app, "/v1/completions", body, lambda _: engine.stats().num_running >= 6
        )
        await wait_until_idle(engine, timeout_s=10)
        assert finished_count(app, "abort") == 6  # 3 prompts x 2 choices
