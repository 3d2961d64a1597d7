"""Every failure answers in OpenAI's error shape with the right status and ``param``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tessel.engine import AsyncEngine
from tessel.server.app import build_app
from tessel.server.settings import ServerSettings
from tests.server.conftest import ENGINE_SETTINGS, serving, wait_until_idle

pytestmark = pytest.mark.asyncio(loop_scope="session")


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


async def test_malformed_json_is_400(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", content=b'{"prompt": "x",', headers={"content-type": "application/json"}
    )
    error = assert_error(r, 400)
    assert "JSON" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": 3}, "prompt"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "stop": 5}, "stop"),
        ({"prompt": "x", "logit_bias": ["a"]}, "logit_bias"),
        ({}, "prompt"),
    ],
)
async def test_wrong_types_are_400_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    assert_error(await client.post("/v1/completions", json=body), 400, param)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("n", 0),
        ("max_tokens", -1),
        ("logprobs", 21),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("top_k", -2),
        ("min_p", 1.5),
        ("repetition_penalty", 0),
        ("min_tokens", -1),
        ("stop_token_ids", [10**9]),
        ("logit_bias", {"7": 101}),
        ("logit_bias", {"not-a-token": 1}),
        ("logit_bias", {"99999999": 1}),
    ],
)
async def test_out_of_range_values_are_400_naming_the_field(
    client: httpx.AsyncClient, field: str, value: Any
) -> None:
    r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, field: value})
    assert_error(r, 400, field)


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_logprobs", 30), ("max_completion_tokens", -2), ("temperature", -1), ("messages", [])],
)
async def test_chat_out_of_range_names_the_chat_field(
    client: httpx.AsyncClient, field: str, value: Any
) -> None:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Hi"}],
        "logprobs": True,
        field: value,
    }
    assert_error(await client.post("/v1/chat/completions", json=body), 400, field)


async def test_unsupported_fields_are_400_not_silence(client: httpx.AsyncClient) -> None:
    assert_error(
        await client.post("/v1/completions", json={"prompt": "x", "suffix": "y"}), 400, "suffix"
    )
    assert_error(
        await client.post("/v1/completions", json={"prompt": "x", "best_of": 3}), 400, "best_of"
    )
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert_error(
        await client.post("/v1/chat/completions", json={**chat, "tools": [{"type": "function"}]}),
        400,
        "tools",
    )
    assert_error(
        await client.post("/v1/chat/completions", json={**chat, "top_logprobs": 2}),
        400,
        "top_logprobs",
    )
    assert_error(
        await client.post(
            "/v1/completions", json={"prompt": "x", "stream_options": {"include_usage": True}}
        ),
        400,
        "stream_options",
    )


async def test_context_overflow_names_both_numbers(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    limit = engine.max_model_len
    r = await client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": limit})
    error = assert_error(r, 400, "max_tokens")
    assert str(limit) in error["message"] and f"{limit} for the completion" in error["message"]
    long_prompt = [42] * (limit + 3)
    error = assert_error(
        await client.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": None}), 400
    )
    assert f"{limit + 3} in the prompt" in error["message"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": limit}
    assert_error(await client.post("/v1/chat/completions", json=chat), 400, "max_completion_tokens")


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    error = assert_error(
        await client.post("/v1/completions", json={"model": "gpt-5", "prompt": "x"}), 404, "model"
    )
    assert error["code"] == "model_not_found"


async def test_api_key_missing_or_wrong_is_401(make_app: Callable[..., FastAPI]) -> None:
    async with serving(make_app(api_key=["sekret", "other"])) as c:
        body = {"prompt": "Hi", "max_tokens": 1}
        assert_error(await c.post("/v1/completions", json=body), 401)
        assert_error(
            await c.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"}),
            401,
        )
        assert_error(await c.get("/v1/models", headers={"Authorization": "Basic sekret"}), 401)
        ok = await c.post("/v1/completions", json=body, headers={"Authorization": "Bearer other"})
        assert ok.status_code == 200
        assert (await c.get("/health")).status_code == 200  # probes stay open


async def test_queue_full_is_429_with_retry_after(
    make_app: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    app = make_app(max_queue=1)
    state = app.state.tessel
    async with serving(app) as c:
        state.num_queued = 1  # one request already waiting for its first token
        r = await c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
        assert_error(r, 429)
        assert r.headers["retry-after"] == "1"
        state.num_queued = 0
        assert (
            await c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
        ).status_code == 200


async def test_queue_fills_with_real_requests(
    make_app: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    """max_queue 1: while one request waits for its first token, the next is refused."""
    app = make_app(max_queue=1)
    async with serving(app) as c:
        body = {"prompt": "Count to ten:", "max_tokens": 4}
        first = asyncio.create_task(c.post("/v1/completions", json=body))
        while app.state.tessel.num_queued == 0:
            assert not first.done(), "the first request ended before it was seen queued"
            await asyncio.sleep(0)
        second = await c.post("/v1/completions", json=body)
        assert_error(second, 429)
        assert (await first).status_code == 200
    await wait_until_idle(engine)


async def test_draining_and_loading_are_503(make_app: Callable[..., FastAPI]) -> None:
    app = make_app()
    async with serving(app) as c:
        app.state.tessel.draining = True
        assert_error(await c.post("/v1/completions", json={"prompt": "x"}), 503)
        assert (await c.get("/ready")).status_code == 503
    loading = build_app(ServerSettings(**ENGINE_SETTINGS))  # lifespan not entered: nothing loads
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=loading), base_url="http://t"
    ) as c:
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/ready")).json() == {"status": "loading"}
        assert_error(
            await c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
            ),
            503,
        )
        # A request naming the model it will serve: still "retry", not a 404 for a name unknown yet.
        named = await c.post("/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "x"})
        assert_error(named, 503)
        assert named.json()["error"]["code"] == "loading"


async def test_unknown_route_and_method_keep_the_shape(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing"), 404)
    assert_error(await client.get("/v1/completions"), 405)
