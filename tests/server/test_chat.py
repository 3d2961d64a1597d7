"""/v1/chat/completions against the real engine: template, shapes, streaming order, logprobs."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tessel.engine import AsyncEngine, SamplingParams
from tests.server.conftest import engine_text
from tests.server.test_completions import sse_chunks

pytestmark = pytest.mark.asyncio(loop_scope="session")

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def templated(engine: AsyncEngine, messages: list[dict[str, Any]]) -> list[int]:
    text = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    ids: list[int] = engine.tokenizer.encode(text, add_special_tokens=False)
    return ids


async def test_chat_greedy_text_and_shape(client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    r = await client.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    (choice,) = body["choices"]
    ids = templated(engine, MESSAGES)
    expected = await engine_text(engine, ids, SamplingParams(max_tokens=8, temperature=0))
    assert choice["message"] == {"role": "assistant", "content": expected[0]}
    assert choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(ids)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_max_completion_tokens_wins_and_text_parts_join(client: httpx.AsyncClient) -> None:
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2 + 2?"}],
        }
    ]
    body = {
        "messages": parts,
        "max_tokens": 9,
        "max_completion_tokens": 3,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = (await client.post("/v1/chat/completions", json=body)).json()
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "length"
    plain = {"messages": MESSAGES, "max_completion_tokens": 3, "temperature": 0, "ignore_eos": True}
    same = (await client.post("/v1/chat/completions", json=plain)).json()
    assert r["choices"][0]["message"] == same["choices"][0]["message"]


async def test_chat_logprobs(client: httpx.AsyncClient) -> None:
    body = {
        "messages": MESSAGES,
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "ignore_eos": True,
    }
    choice = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 4
    assert "".join(e["token"] for e in content) == choice["message"]["content"]
    for entry in content:
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-4)


async def test_chat_stream_role_first_then_content(client: httpx.AsyncClient) -> None:
    body = {"messages": MESSAGES, "max_tokens": 5, "temperature": 0, "n": 2, "ignore_eos": True}
    whole = (await client.post("/v1/chat/completions", json=body)).json()
    r = await client.post(
        "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = sse_chunks(r.text)
    *content, last = chunks
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    seen_role: set[int] = set()
    texts = ["", ""]
    finish: dict[int, str] = {}
    for chunk in content:
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"].startswith("chatcmpl-")
        (choice,) = chunk["choices"]
        index, delta = choice["index"], choice["delta"]
        if "role" in delta:
            assert delta == {"role": "assistant", "content": ""} and index not in seen_role
            seen_role.add(index)
            continue
        assert index in seen_role, "content before the role"
        assert index not in finish, "content after finish_reason"
        texts[index] += delta.get("content", "")
        if choice["finish_reason"]:
            finish[index] = choice["finish_reason"]
    assert texts == [c["message"]["content"] for c in whole["choices"]]
    assert finish == {0: "length", 1: "length"}


async def test_developer_role_and_unknown_role(client: httpx.AsyncClient) -> None:
    messages = [{"role": "developer", "content": "Be brief."}, *MESSAGES]
    ok = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert ok.status_code == 200
    bad = await client.post(
        "/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
