"""The official ``openai`` client against a real ``tessel serve``; greedy texts equal the
offline ``engine.LLM`` on the same prompts. Every test runs twice: the engine in the server's
process (the CPU default) and in a process of its own (``--engine-process on``, a GPU's)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from tessel.engine import LLM, SamplingParams
from tests.e2e.conftest import API_KEY, ServerProcess, start_server, stop_server

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
GREEDY = SamplingParams(max_tokens=8, temperature=0)


def offline(
    llm: LLM, prompts: list[str] | list[list[int]], params: SamplingParams = GREEDY
) -> list[str]:
    return [out.outputs[0].text for out in llm.generate(prompts, params)]


def chat_ids(llm: LLM, content: str) -> list[int]:
    messages = [{"role": "user", "content": content}]
    text = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids: list[int] = llm.tokenizer.encode(text, add_special_tokens=False)
    return ids


@pytest.fixture(scope="module", params=["off", "on"], ids=["in-process", "engine-process"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("tessel"), "--engine-process", request.param)
    assert ("[engine] loaded" in srv.log()) == (request.param == "on")  # the child logs as [engine]
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120
    )


@pytest.fixture
def aclient(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=300
    )


def test_models_and_auth(client: openai.OpenAI, server: ServerProcess) -> None:
    (model,) = client.models.list().data
    assert model.id == "SmolLM2-135M-Instruct"
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=model.id, prompt="x", max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=model.id, prompt="x", temperature=-1)


def test_sync_completions_match_offline(client: openai.OpenAI, llm: LLM) -> None:
    r = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=PROMPTS, max_tokens=8, temperature=0
    )
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == offline(llm, PROMPTS)
    assert r.usage is not None and r.usage.completion_tokens == 8 * len(PROMPTS)


def test_sync_streaming_completion_matches_offline(client: openai.OpenAI, llm: LLM) -> None:
    stream = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt=PROMPTS[0],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == offline(llm, PROMPTS[:1])[0]
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage is not None
        and chunks[-1].usage.completion_tokens == 8
    )


async def test_async_chat_matches_offline(aclient: openai.AsyncOpenAI, llm: LLM) -> None:
    question = "What is the capital of France?"
    r = await aclient.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": question}],
        max_tokens=8,
        temperature=0,
    )
    assert r.choices[0].message.content == offline(llm, [chat_ids(llm, question)])[0]
    stream = await aclient.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": question}],
        max_completion_tokens=8,
        temperature=0,
        stream=True,
    )
    deltas = [chunk async for chunk in stream]
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(d.choices[0].delta.content or "" for d in deltas) == r.choices[0].message.content


def test_n_logprobs_echo_and_stop(client: openai.OpenAI, llm: LLM) -> None:
    model = "SmolLM2-135M-Instruct"
    r = client.completions.create(
        model=model, prompt=PROMPTS[0], max_tokens=4, n=3, temperature=0.8, seed=7
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    stream = client.completions.create(
        model=model, prompt=PROMPTS[0], max_tokens=4, n=2, temperature=0, stream=True
    )
    texts = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == offline(llm, PROMPTS[:1], SamplingParams(max_tokens=4, temperature=0)) * 2

    scored = client.completions.create(
        model=model, prompt=PROMPTS[0], max_tokens=0, echo=True, logprobs=1
    )
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == PROMPTS[0] and lp is not None
    assert (
        lp.token_logprobs is not None
        and lp.token_logprobs[0] is None
        and len(lp.token_logprobs) > 1
    )

    full = offline(llm, PROMPTS[:1])[0]
    stop = full.strip()[:2]
    stopped = client.completions.create(
        model=model, prompt=PROMPTS[0], max_tokens=8, temperature=0, stop=[stop]
    )
    assert (
        stopped.choices[0].finish_reason == "stop"
        and stopped.choices[0].text == full[: full.index(stop)]
    )

    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]


async def test_32_concurrent_streams_all_finish_correctly(
    aclient: openai.AsyncOpenAI, llm: LLM
) -> None:
    prompts = [f"Fact number {i}: the" for i in range(32)]
    expected = offline(llm, prompts)

    async def one(prompt: str) -> str:
        stream = await aclient.completions.create(
            model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=8, temperature=0, stream=True
        )
        text, reason = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        assert reason in ("stop", "length")
        return text

    got = await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), timeout=300)
    assert got == expected
