"""API keys from flags, environment and a file; probes open; /metrics keyed by a setting;
CORS off unless configured; prompts never logged unless asked; request ids on log lines;
the waiting queue bounded by prompt tokens before any tokenizing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from tessel.engine import AsyncEngine
from tessel.server import auth
from tessel.server.request_log import install_request_ids
from tests.server.conftest import serving, wait_until_idle
from tests.server.test_errors import assert_error

pytestmark = pytest.mark.asyncio(loop_scope="session")

BODY = {"prompt": "Hi", "max_tokens": 1}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_keys_from_flags_environment_and_file(
    make_app: Callable[..., FastAPI], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "keys.txt"
    key_file.write_text("# operators\nfile-key-1\n\n  file-key-2  \n")
    monkeypatch.setenv("TESSEL_API_KEY", "env-a,env-b")  # the environment fills the setting
    app = make_app(api_key_file=str(key_file))
    assert app.state.tessel.api_keys == ["env-a", "env-b", "file-key-1", "file-key-2"]
    async with serving(app) as c:
        for key in ("env-a", "env-b", "file-key-1", "file-key-2"):
            r = await c.post("/v1/completions", json=BODY, headers=bearer(key))
            assert r.status_code == 200, key
        for wrong in ("# operators", "file-key", "env-a,env-b", ""):
            assert_error(await c.post("/v1/completions", json=BODY, headers=bearer(wrong)), 401)
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/ready")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200  # open unless keyed
    monkeypatch.delenv("TESSEL_API_KEY")
    async with serving(make_app(api_key=["flag-key"], metrics_require_key=True)) as c:
        assert_error(await c.get("/metrics"), 401)
        assert_error(await c.get("/metrics", headers=bearer("nope")), 401)
        scrape = await c.get("/metrics", headers=bearer("flag-key"))
        assert scrape.status_code == 200 and "tessel_" in scrape.text
        assert (await c.get("/ready")).status_code == 200


async def test_a_missing_key_file_fails_at_start(make_app: Callable[..., FastAPI]) -> None:
    with pytest.raises(FileNotFoundError):
        make_app(api_key_file="/nonexistent/keys")


async def test_every_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert auth.key_matches("k1", ["k1", "k2", "k3"])
    assert len(calls) == 3  # no early exit on the first match: timing tells nothing
    assert not auth.key_matches("k", ["k1", "k2"])


async def test_cors_off_unless_configured(make_app: Callable[..., FastAPI]) -> None:
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    async with serving(make_app()) as c:
        r = await c.options("/v1/completions", headers=preflight)
        assert "access-control-allow-origin" not in r.headers
        r = await c.post("/v1/completions", json=BODY, headers={"Origin": "https://app.example"})
        assert "access-control-allow-origin" not in r.headers
    async with serving(make_app(cors_allow_origins=["https://app.example"])) as c:
        r = await c.options("/v1/completions", headers=preflight)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        other = await c.options("/v1/completions", headers={**preflight, "Origin": "https://evil"})
        assert "access-control-allow-origin" not in other.headers


async def logged(
    make_app: Callable[..., FastAPI], caplog: pytest.LogCaptureFixture, **settings: Any
) -> tuple[list[logging.LogRecord], str]:
    install_request_ids()
    caplog.clear()
    caplog.set_level(logging.INFO)
    async with serving(make_app(**settings)) as c:
        for stream in (False, True):
            r = await c.post(
                "/v1/completions",
                json={"prompt": "SECRET-PROMPT-42", "max_tokens": 3, "stream": stream},
                headers={"X-Request-Id": f"req-test-{int(stream)}"},
            )
            assert r.status_code == 200 and r.headers["x-request-id"] == f"req-test-{int(stream)}"
        output = (
            await c.post("/v1/completions", json={"prompt": "SECRET-PROMPT-42", "max_tokens": 3})
        ).json()["choices"][0]["text"]
    return list(caplog.records), output


async def test_prompts_and_outputs_are_not_logged_by_default(
    make_app: Callable[..., FastAPI], caplog: pytest.LogCaptureFixture
) -> None:
    records, output = await logged(make_app, caplog)
    lines = [r.getMessage() for r in records]
    done = [r for r in records if r.name == "tessel.requests"]
    assert [r.request_id for r in done[:2]] == ["req-test-0", "req-test-1"]  # type: ignore[attr-defined]
    assert all("prompt + 3 generated tokens" in r.getMessage() for r in done)
    assert not any("SECRET-PROMPT" in line for line in lines)
    # The log writes texts with repr, so look for that form: a bare sampled text as short as
    # "1" could otherwise match a hex response id.
    assert output.strip() and not any(repr([output]) in line for line in lines)


async def test_log_prompts_setting_logs_them(
    make_app: Callable[..., FastAPI], caplog: pytest.LogCaptureFixture
) -> None:
    records, output = await logged(make_app, caplog, log_prompts=True)
    done = [r.getMessage() for r in records if r.name == "tessel.requests"]
    assert len(done) == 3 and all("SECRET-PROMPT-42" in line for line in done)
    assert repr([output]) in done[-1]  # repr: sampled text may hold a newline


async def test_a_bad_request_id_header_is_replaced(make_app: Callable[..., FastAPI]) -> None:
    async with serving(make_app()) as c:
        r = await c.get("/health", headers={"X-Request-Id": "bad id\twith spaces"})
        assert r.headers["x-request-id"].startswith("req-")


async def test_queue_bounded_by_prompt_tokens_before_tokenizing(
    make_app: Callable[..., FastAPI], engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(max_queue_tokens=50)
    state = app.state.tessel
    encoded: list[Any] = []
    real_encode = engine.tokenizer.encode
    monkeypatch.setattr(
        engine.tokenizer, "encode", lambda *a, **k: encoded.append(a) or real_encode(*a, **k)
    )
    async with serving(app) as c:
        engine.inject_step_fault("stall", 1.5)  # the first request stays queued (no token yet)
        first = asyncio.create_task(
            c.post("/v1/completions", json={"prompt": [7] * 40, "max_tokens": 2})
        )
        while state.num_queued == 0:
            await asyncio.sleep(0.01)
        assert state.num_queued_tokens == 40
        calls = len(encoded)
        # ~100 characters: about 26 tokens by the estimate, 40 + 26 > 50
        refused = await c.post("/v1/completions", json={"prompt": "word " * 20, "max_tokens": 1})
        error = assert_error(refused, 429)
        assert "prompt tokens waiting" in error["message"] and refused.headers["retry-after"]
        chat = {"messages": [{"role": "user", "content": "word " * 20}], "max_tokens": 1}
        assert_error(await c.post("/v1/chat/completions", json=chat), 429)
        assert len(encoded) == calls, "a refused request was tokenized"
        small = await c.post("/v1/completions", json={"prompt": [9] * 5, "max_tokens": 1})
        assert small.status_code == 200  # 40 + 5 fits
        assert (await first).status_code == 200
    assert (state.num_queued, state.num_queued_tokens, state.num_in_flight) == (0, 0, 0)
    await wait_until_idle(engine)
