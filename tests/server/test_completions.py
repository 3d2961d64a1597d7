"""/v1/completions against the real engine: shapes, texts, logprobs, echo, stop, streaming."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from tessel.engine import AsyncEngine, SamplingParams
from tests.server.conftest import engine_text

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROMPT = "The capital of France is"


def sse_chunks(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE body, checking the framing and the final [DONE]."""
    frames = text.split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]", text[-200:]
    assert all(f.startswith("data: ") for f in frames[:-1])
    return [json.loads(f.removeprefix("data: ")) for f in frames[:-2]]


async def test_greedy_text_and_shape(client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    r = await client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["model"] == engine.model_name and isinstance(body["created"], int)
    (choice,) = body["choices"]
    expected = await engine_text(engine, PROMPT, SamplingParams(max_tokens=8, temperature=0))
    assert choice["text"] == expected[0]
    assert (
        choice["finish_reason"] == "length" and choice["index"] == 0 and choice["logprobs"] is None
    )
    prompt_len = len(engine.tokenizer.encode(PROMPT))
    assert body["usage"] == {
        "prompt_tokens": prompt_len,
        "completion_tokens": 8,
        "total_tokens": prompt_len + 8,
    }


async def test_default_max_tokens_is_16(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", json={"prompt": PROMPT, "temperature": 0, "ignore_eos": True}
    )
    assert r.json()["usage"]["completion_tokens"] == 16


async def test_prompt_forms_and_choice_indices(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    ids = engine.tokenizer.encode(PROMPT)
    prompts: list[Any] = [[PROMPT, "Once upon a time"], ids, [ids, ids]]
    greedy = (await engine_text(engine, PROMPT, SamplingParams(max_tokens=4, temperature=0)))[0]
    for prompt in prompts:
        r = await client.post(
            "/v1/completions", json={"prompt": prompt, "max_tokens": 4, "temperature": 0, "n": 2}
        )
        body = r.json()
        num_prompts = 1 if isinstance(prompt[0], int) else 2
        assert [c["index"] for c in body["choices"]] == list(range(2 * num_prompts))
        assert body["choices"][0]["text"] == greedy  # the string and its ids agree
        assert body["usage"]["completion_tokens"] == 4 * 2 * num_prompts


async def test_logprobs_shape_and_values(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 3}
    )
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert (
        len(lp["tokens"])
        == len(lp["token_logprobs"])
        == len(lp["top_logprobs"])
        == len(lp["text_offset"])
        == 5
    )
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(5)]
    for token, value, top in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        assert value <= 0 and 1 <= len(top) <= 3
        assert math.isclose(max(top.values()), value, abs_tol=1e-4)  # greedy picks the best token
        assert token in top


async def test_echo_with_zero_max_tokens_scores_the_prompt(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """lm-eval's loglikelihood request: the prompt echoed with its logprobs, nothing generated."""
    r = await client.post(
        "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    (choice,) = body["choices"]
    ids = engine.tokenizer.encode(PROMPT)
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) and "".join(lp["tokens"]) == PROMPT
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v is not None and v <= 0 for v in lp["token_logprobs"][1:])
    assert body["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": 0,
        "total_tokens": len(ids),
    }


async def test_echo_prepends_the_prompt(client: httpx.AsyncClient) -> None:
    plain = await client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    )
    echo = await client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "echo": True}
    )
    assert echo.json()["choices"][0]["text"] == PROMPT + plain.json()["choices"][0]["text"]


async def test_stop_string_ends_with_finish_reason_stop(client: httpx.AsyncClient) -> None:
    full = await client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    )
    text = full.json()["choices"][0]["text"]
    stop = text.strip()[:3]
    assert stop, text
    r = await client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stop": stop}
    )
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == text[: text.index(stop)]


async def test_stream_matches_non_stream(client: httpx.AsyncClient) -> None:
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "n": 2, "logprobs": 1}
    whole = (await client.post("/v1/completions", json=body)).json()
    r = await client.post(
        "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = sse_chunks(r.text)
    *content, last = chunks
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    texts = ["", ""]
    reasons: list[str | None] = [None, None]
    for chunk in content:
        assert chunk["id"].startswith("cmpl-") and chunk["object"] == "text_completion"
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        assert choice["logprobs"] is not None and len(choice["logprobs"]["tokens"]) <= 1
        if choice["finish_reason"]:
            reasons[choice["index"]] = choice["finish_reason"]
    assert texts == [c["text"] for c in whole["choices"]]
    assert reasons == ["length", "length"]
    assert len({c["id"] for c in chunks}) == 1


async def test_stream_without_usage_has_no_usage_chunk(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "stream": True}
    )
    chunks = sse_chunks(r.text)
    assert all(chunk["choices"] and "usage" not in chunk for chunk in chunks)


async def test_seeded_sampling_is_reproducible(client: httpx.AsyncClient) -> None:
    body = {
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 1234,
        "top_k": 50,
        "min_p": 0.01,
    }
    first = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
    second = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
    assert first == second


async def test_logit_bias_forces_a_token(client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    token = engine.tokenizer.encode(" banana")[0]
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logit_bias": {str(token): 100}}
    r = await client.post("/v1/completions", json=body)
    assert r.json()["choices"][0]["text"] == engine.tokenizer.decode([token] * 3)
