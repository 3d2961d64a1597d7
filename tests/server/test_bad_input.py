"""Hand-made bad requests, each with the status and message it must get; afterwards the
server still answers correctly and holds no request and no KV block."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tessel.engine import AsyncEngine, SamplingParams
from tests.server.conftest import ENGINE_SETTINGS, engine_text, serving, wait_until_idle
from tests.server.test_errors import assert_error

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
CONTEXT = ENGINE_SETTINGS["max_model_len"]
VOCAB = 49152  # SmolLM2's vocabulary


def chat(content: Any = "Hi", role: str = "user", **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": content}], "max_tokens": 2, **fields}


def raw(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


# (name, path, body: a dict sent as JSON or raw bytes, status, substring of the message)
CASES: list[tuple[str, str, dict[str, Any] | bytes, int, str]] = [
    ("malformed JSON", COMPLETIONS, raw('{"prompt": "x",'), 400, "not valid JSON"),
    ("truncated JSON", COMPLETIONS, raw('{"prompt": "abc'), 400, "not valid JSON"),
    ("not an object", COMPLETIONS, raw("[1, 2]"), 400, "valid dictionary"),
    ("JSON null body", CHAT, raw("null"), 400, "valid dictionary"),
    ("wrong type: prompt", COMPLETIONS, {"prompt": 3}, 400, "prompt"),
    ("wrong type: n float", COMPLETIONS, {"prompt": "x", "n": 2.5}, 400, "n:"),
    ("wrong type: messages", CHAT, {"messages": "hello"}, 400, "messages"),
    ("missing prompt", COMPLETIONS, {"max_tokens": 1}, 400, "prompt"),
    ("empty prompt", COMPLETIONS, {"prompt": ""}, 400, "at least one token"),
    ("empty prompt list", COMPLETIONS, {"prompt": []}, 400, "must not be empty"),
    ("empty token list", COMPLETIONS, {"prompt": [[]]}, 400, "at least one token"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("negative token id", COMPLETIONS, {"prompt": [5, -1]}, 400, "token id -1 is not in"),
    ("token id = vocab", COMPLETIONS, {"prompt": [VOCAB]}, 400, f"token id {VOCAB} is not in"),
    ("token id huge", COMPLETIONS, {"prompt": [[1], [10**20]]}, 400, "is not in [0"),
    ("prompt over context", COMPLETIONS, {"prompt": [42] * (CONTEXT + 5)}, 400, "context length"),
    ("max_tokens < 0", COMPLETIONS, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("max_tokens huge", COMPLETIONS, {"prompt": "x", "max_tokens": 10**30}, 400, "context length"),
    ("chat max_tokens < 0", CHAT, chat(max_completion_tokens=-5), 400, "max_completion_tokens"),
    ("temperature < 0", COMPLETIONS, {"prompt": "x", "temperature": -0.1}, 400, "temperature"),
    ("temperature NaN", COMPLETIONS, raw('{"prompt": "x", "temperature": NaN}'), 400, "finite"),
    ("top_p Infinity", COMPLETIONS, raw('{"prompt": "x", "top_p": Infinity}'), 400, "finite"),
    ("top_p = 0", COMPLETIONS, {"prompt": "x", "top_p": 0}, 400, "top_p must be in (0, 1]"),
    ("top_p > 1", COMPLETIONS, {"prompt": "x", "top_p": 1.01}, 400, "top_p must be in (0, 1]"),
    ("n = 0", COMPLETIONS, {"prompt": "x", "n": 0}, 400, "n must be >= 1"),
    ("n over the limit", COMPLETIONS, {"prompt": "x", "n": 129}, 400, "n must be <= 128"),
    ("logprobs > 20", COMPLETIONS, {"prompt": "x", "logprobs": 21}, 400, "logprobs must be in"),
    ("top_logprobs > 20", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("too many stops", COMPLETIONS, {"prompt": "x", "stop": ["a"] * 17}, 400, "at most 16"),
    ("stop too long", COMPLETIONS, {"prompt": "x", "stop": "s" * 257}, 400, "at most 256"),
    ("empty stop", COMPLETIONS, {"prompt": "x", "stop": [""]}, 400, "non-empty"),
    ("logit_bias key", COMPLETIONS, {"prompt": "x", "logit_bias": {"a": 1}}, 400, "token ids"),
    (
        "logit_bias id",
        COMPLETIONS,
        {"prompt": "x", "logit_bias": {"-3": 1}},
        400,
        "token id -3 is not in",
    ),
    ("logit_bias value", COMPLETIONS, {"prompt": "x", "logit_bias": {"5": 500}}, 400, "[-100"),
    ("seed over int64", COMPLETIONS, {"prompt": "x", "seed": 2**70}, 400, "seed must fit"),
    ("timeout <= 0", COMPLETIONS, {"prompt": "x", "timeout": 0}, 400, "timeout"),
    ("too many prompts", COMPLETIONS, {"prompt": ["a"] * 65}, 400, "at most 64 prompts"),
    ("invalid UTF-8", COMPLETIONS, b'{"prompt": "\xff\xfe"}', 400, "parsing the body"),
    ("lone surrogate", COMPLETIONS, raw('{"prompt": "a\\ud800"}'), 400, "lone surrogate"),
    (
        "surrogate in chat",
        CHAT,
        raw(r'{"messages":[{"role":"user","content":"\udfff"}]}'),
        400,
        "lone surrogate",
    ),
    (
        "surrogate in stop",
        COMPLETIONS,
        raw('{"prompt": "x", "stop": "\\ud83d"}'),
        400,
        "lone surrogate",
    ),
    ("unknown role", CHAT, chat(role="wizard"), 400, "messages"),
    ("content of numbers", CHAT, chat(content=[1, 2]), 400, "messages"),
    (
        "image part",
        CHAT,
        chat(content=[{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": "x"}}]),
        400,
        "messages.0.content: content parts of type 'image_url' are not supported",
    ),
    ("deep JSON", COMPLETIONS, raw("[" * 100_000 + "]" * 100_000), 400, "parsing the body"),
    ("deep field", COMPLETIONS, raw('{"prompt":' + "[" * 50 + "]" * 50 + "}"), 400, "prompt"),
    ("unknown model", COMPLETIONS, {"prompt": "x", "model": "gpt-9"}, 404, "does not exist"),
    ("unknown model, chat", CHAT, chat(model="nope"), 404, "does not exist"),
    ("suffix", COMPLETIONS, {"prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("tokenize surrogate", "/tokenize", raw('{"prompt": "\\udc00"}'), 400, "lone surrogate"),
    ("detokenize id", "/detokenize", {"tokens": [-4]}, 400, "token id -4"),
]


async def send(
    client: httpx.AsyncClient, path: str, body: dict[str, Any] | bytes
) -> httpx.Response:
    if isinstance(body, bytes):
        return await client.post(path, content=body, headers={"content-type": "application/json"})
    return await client.post(path, json=body)


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
async def test_bad_request_gets_its_status_and_message(
    client: httpx.AsyncClient, path: str, body: dict[str, Any] | bytes, status: int, message: str
) -> None:
    error = assert_error(await send(client, path, body), status)
    assert message in error["message"], error


async def test_body_over_the_limit_is_413(make_app: Callable[..., FastAPI]) -> None:
    async with serving(make_app(max_request_bytes=2048)) as c:
        big = {"prompt": "x" * 4096, "max_tokens": 1}
        error = assert_error(await c.post(COMPLETIONS, json=big), 413)
        assert "2048 bytes" in error["message"] and error["code"] == "request_too_large"

        async def chunked() -> Any:  # no Content-Length: counted while it is read
            yield b'{"prompt": "'
            for _ in range(8):
                yield b"y" * 512
            yield b'"}'

        r = await c.post(
            COMPLETIONS, content=chunked(), headers={"content-type": "application/json"}
        )
        assert_error(r, 413)
        ok = await c.post(COMPLETIONS, json={"prompt": "x" * 100, "max_tokens": 1})
        assert ok.status_code == 200


async def test_max_tokens_limit_caps_and_refuses(make_app: Callable[..., FastAPI]) -> None:
    async with serving(make_app(max_tokens_limit=3)) as c:
        error = assert_error(await c.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 4}), 400)
        assert "max_tokens must be <= 3" in error["message"]
        assert_error(
            await c.post(CHAT, json=chat(max_completion_tokens=9)), 400, "max_completion_tokens"
        )
        body = {"prompt": "Once upon", "max_tokens": None, "ignore_eos": True}
        r = (await c.post(COMPLETIONS, json=body)).json()
        assert r["usage"]["completion_tokens"] == 3  # null: up to the limit, not the context


async def test_after_all_the_bad_input_all_is_well(
    make_app: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    """Every case above, once more on one app: nothing is left behind, and it still serves."""
    app = make_app()
    async with serving(app) as c:
        for _, path, body, status, _ in CASES:
            assert (await send(c, path, body)).status_code == status
        await wait_until_idle(engine, timeout_s=10)
        state = app.state.tessel
        assert (state.num_in_flight, state.num_queued, state.num_queued_tokens) == (0, 0, 0)
        stats = engine.stats()
        assert stats.num_running == 0 and stats.num_waiting == 0
        params = SamplingParams(max_tokens=6, temperature=0)
        body = {"prompt": "The sky is", "max_tokens": 6, "temperature": 0}
        text = (await c.post(COMPLETIONS, json=body)).json()["choices"][0]["text"]
        assert text == (await engine_text(engine, "The sky is", params))[0]
