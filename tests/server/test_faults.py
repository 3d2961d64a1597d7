"""Faults: a failed model step, a request past its deadline, a stuck engine loop.

Each is injected through the engine's test-only hook (``AsyncEngine.inject_step_fault``) or
a short timeout; every case checks what the client is told, that no KV block is left
behind, and that the next request is served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tessel.engine import AsyncEngine, SamplingParams
from tests.server.conftest import engine_text, serving, wait_until_idle
from tests.server.test_completions import sse_chunks
from tests.server.test_disconnect import finished_count
from tests.server.test_errors import assert_error

pytestmark = pytest.mark.asyncio(loop_scope="session")

LONG = {"prompt": "Tell me a story.", "max_tokens": 400, "ignore_eos": True, "temperature": 0}
SHORT = {"prompt": "The sky is", "max_tokens": 5, "temperature": 0}


async def served_correctly(c: httpx.AsyncClient, engine: AsyncEngine) -> None:
    r = await c.post("/v1/completions", json=SHORT)
    assert r.status_code == 200, r.text
    expected = await engine_text(
        engine, SHORT["prompt"], SamplingParams(max_tokens=5, temperature=0)
    )
    assert r.json()["choices"][0]["text"] == expected[0]


def error_event(chunks_text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the choice chunks, the error object) of a stream that ended in an error event."""
    chunks = sse_chunks(chunks_text)
    assert "error" in chunks[-1], chunks[-1]
    return chunks[:-1], chunks[-1]["error"]


async def test_failed_step_is_500_then_next_request_served(
    make_app: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    app = make_app()
    async with serving(app) as c:
        engine.inject_step_fault("raise")
        r = await c.post("/v1/completions", json={**SHORT, "n": 2})
        error = assert_error(r, 500)
        assert error["type"] == "server_error" and error["code"] == "engine_error"
        assert "injected fault" in error["message"]
        await wait_until_idle(engine, timeout_s=10)
        assert finished_count(app, "error") == 2  # both choices
        await served_correctly(c, engine)
        assert app.state.tessel.num_in_flight == 0


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_failed_step_mid_stream_ends_with_error_event(
    make_app: Callable[..., FastAPI], engine: AsyncEngine, path: str
) -> None:
    app = make_app()
    body: dict[str, Any] = {**LONG, "stream": True, "n": 2}
    if "chat" in path:
        body = {**body, "messages": [{"role": "user", "content": body.pop("prompt")}]}
    async with serving(app) as c:
        for _ in range(3):  # prefill and two decode steps pass, the fourth step fails
            engine.inject_step_fault("stall", 0.0)
        engine.inject_step_fault("raise")
        r = await c.post(path, json=body)
        assert r.status_code == 200
        chunks, error = error_event(r.text)
        assert error["code"] == "engine_error" and error["type"] == "server_error"
        reasons = {
            ch["choices"][0]["index"]: ch["choices"][0]["finish_reason"]
            for ch in chunks
            if ch["choices"] and ch["choices"][0]["finish_reason"]
        }
        assert reasons == {0: "error", 1: "error"}
        texts = [
            ch["choices"][0].get("text") or ch["choices"][0].get("delta", {}).get("content")
            for ch in chunks
        ]
        assert any(texts), "the steps before the fault streamed their tokens"
        await wait_until_idle(engine, timeout_s=10)
        await served_correctly(c, engine)


async def test_request_timeout_field_aborts_and_frees(
    make_app: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    app = make_app()
    async with serving(app) as c:
        start = asyncio.get_running_loop().time()
        error = assert_error(await c.post("/v1/completions", json={**LONG, "timeout": 0.5}), 408)
        assert error["code"] == "request_timeout" and "0.5 s" in error["message"]
        assert asyncio.get_running_loop().time() - start < 5
        await wait_until_idle(engine, timeout_s=10)
        assert finished_count(app, "abort") == 1
        stream = await c.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 400,
                "ignore_eos": True,
                "stream": True,
                "timeout": 0.5,
            },
        )
        chunks, error = error_event(stream.text)
        assert error["code"] == "request_timeout"
        assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
        await wait_until_idle(engine, timeout_s=10)
        await served_correctly(c, engine)


async def test_server_timeout_bounds_the_request_field(
    make_app: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    async with serving(make_app(request_timeout_s=1.5)) as c:
        r = await c.post("/v1/completions", json={**LONG, "timeout": 100})  # cannot raise it
        assert assert_error(r, 408)["message"].endswith("1.5 s")
        await wait_until_idle(engine, timeout_s=10)
        await served_correctly(c, engine)  # a quick request stays inside the limit


async def test_stuck_engine_turns_ready_503_and_logs(
    make_app: Callable[..., FastAPI], engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(watchdog_timeout_s=0.3)
    caplog.set_level(logging.WARNING, logger="tessel.watchdog")
    async with serving(app) as c:
        assert (await c.get("/ready")).status_code == 200
        engine.inject_step_fault("stall", 2.5)  # the device hangs for 2.5 s
        request = asyncio.create_task(c.post("/v1/completions", json=SHORT))
        seen = None
        for _ in range(100):
            await asyncio.sleep(0.05)
            ready = await c.get("/ready")
            if ready.status_code == 503:
                seen = ready.json()
                break
        assert seen == {"status": "stalled"}
        assert "no engine step finished" in caplog.text
        metrics = (await c.get("/metrics")).text
        assert 'tessel_engine_stalled{model_name="' in metrics and "} 1.0" in metrics
        assert (await request).status_code == 200  # the stall passes, the request finishes
        for _ in range(40):
            if (await c.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.05)
        assert (await c.get("/ready")).json() == {"status": "ready"}
        assert "makes progress again" in caplog.text
        await wait_until_idle(engine)
