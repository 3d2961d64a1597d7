"""/v1/models, /health, /ready, /tokenize, /detokenize."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI

from tessel.engine import AsyncEngine
from tests.server.conftest import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_models_lists_the_served_name(
    make_app: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    async with serving(make_app(served_model_name="tiny")) as c:
        body = (await c.get("/v1/models")).json()
        assert body["object"] == "list"
        assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [
            ("tiny", "model", engine.max_model_len)
        ]
        ok = await c.post(
            "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 1}
        )
        assert ok.json()["model"] == "tiny"
        assert (
            await c.post("/v1/completions", json={"model": engine.model_name, "prompt": "Hi"})
        ).status_code == 404


async def test_health_and_ready(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).json() == {"status": "ready"}


async def test_tokenize_detokenize_round_trip(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    text = "Hello, tokenizer! ünïcödé"
    r = (await client.post("/tokenize", json={"prompt": text})).json()
    assert r["tokens"] == engine.tokenizer.encode(text) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == engine.max_model_len
    assert (await client.post("/detokenize", json={"tokens": r["tokens"]})).json() == {
        "prompt": text
    }
    chat = (
        await client.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]})
    ).json()
    usage = (
        await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
        )
    ).json()["usage"]
    assert chat["count"] == usage["prompt_tokens"]
    bad = await client.post("/detokenize", json={"tokens": [engine.vocab_size]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
