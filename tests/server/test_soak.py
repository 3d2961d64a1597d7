"""Soak: 2,000 mixed requests through the real app and engine, bounded in time.

Streamed and not, completions and chat, n > 1, logprobs, stops, client aborts and request
timeouts. Requests that return a usage go through one app, aborts and timeouts through a
second app on the same engine, so the first app's token counters must equal the summed
usage exactly. Resident memory after warm-up must stay flat (under 5% growth), and at the
end no request and no KV block is left. Minutes of CPU: ``make soak`` runs it (CI does).
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tessel.engine import AsyncEngine
from tests.server.conftest import serving, wait_until_idle
from tests.server.test_metrics import scrape, value

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow, pytest.mark.soak]

NUM_REQUESTS = 2000
WARM_UP = 300
CONCURRENCY = 32
TIME_LIMIT_S = 600  # a bound, not a benchmark: this CPU is shared


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def make_body(rng: random.Random, i: int) -> tuple[str, dict[str, Any]]:
    kind = rng.choice(("completion", "completion", "chat"))
    common: dict[str, Any] = {
        "max_tokens": rng.randint(1, 4),
        "temperature": rng.choice((0, 0.8)),
        "n": rng.choice((1, 1, 1, 2)),
        "stream": rng.random() < 0.5,
    }
    if rng.random() < 0.2:
        common["stop"] = [" the", "."]
    if common["stream"]:
        common["stream_options"] = {"include_usage": True}
    text = f"Soak {i}: {rng.choice(('The sea is', 'Count: 1, 2,', 'Hello there', 'Why'))}"
    if kind == "chat":
        body = {"messages": [{"role": "user", "content": text}], **common}
        if rng.random() < 0.3:
            body |= {"logprobs": True, "top_logprobs": 2}
        return "/v1/chat/completions", body
    body = {"prompt": rng.choice((text, [text, text + " again"])), **common}
    if rng.random() < 0.3:
        body["logprobs"] = 2
    return "/v1/completions", body


def usage_of(response: httpx.Response, stream: bool) -> dict[str, int]:
    assert response.status_code == 200, response.text[:300]
    if not stream:
        usage: dict[str, int] = response.json()["usage"]
        return usage
    frames = [f.removeprefix("data: ") for f in response.text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    last: dict[str, int] = json.loads(frames[-2])["usage"]
    return last


async def test_soak_mixed_requests(make_app: Callable[..., FastAPI], engine: AsyncEngine) -> None:
    rng = random.Random(2000)
    served_app, broken_app = make_app(served_model_name="soak"), make_app()
    totals = {"prompt": 0, "completion": 0, "aborted": 0, "timed_out": 0}
    rss: dict[str, int] = {}
    gate = asyncio.Semaphore(CONCURRENCY)
    start = time.monotonic()
    async with serving(served_app) as served, serving(broken_app) as broken:

        async def one(i: int) -> None:
            path, body = make_body(rng, i)
            roll = rng.random()
            async with gate:
                if roll < 0.07:  # the client gives up part-way
                    task = asyncio.create_task(broken.post(path, json={**body, "max_tokens": 16}))
                    await asyncio.sleep(rng.uniform(0, 0.15))
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    totals["aborted"] += 1
                elif roll < 0.14:  # past its own deadline
                    long = {**body, "max_tokens": 64, "ignore_eos": True, "timeout": 0.05}
                    r = await broken.post(path, json=long)
                    assert r.status_code in (200, 408), r.text[:300]
                    totals["timed_out"] += r.status_code == 408 or "request_timeout" in r.text
                else:
                    usage = usage_of(await served.post(path, json=body), body["stream"])
                    totals["prompt"] += usage["prompt_tokens"]
                    totals["completion"] += usage["completion_tokens"]

        await asyncio.gather(*(one(i) for i in range(WARM_UP)))
        await wait_until_idle(engine)
        gc.collect()
        rss["warm"] = rss_bytes()
        await asyncio.gather(*(one(i) for i in range(WARM_UP, NUM_REQUESTS)))
        await wait_until_idle(engine, timeout_s=30)
        gc.collect()
        rss["end"] = rss_bytes()
        samples = await scrape(served)
    elapsed = time.monotonic() - start
    growth = rss["end"] / rss["warm"] - 1
    print(
        f"soak: {NUM_REQUESTS} requests in {elapsed:.0f} s, {totals}, RSS "
        f"{rss['warm'] / 2**20:.0f} -> {rss['end'] / 2**20:.0f} MiB ({growth:+.2%})"
    )
    assert elapsed < TIME_LIMIT_S
    assert growth < 0.05, rss
    assert totals["aborted"] > 50 and totals["timed_out"] > 50
    assert value(samples, "tessel_prompt_tokens_total", model_name="soak") == totals["prompt"]
    assert (
        value(samples, "tessel_generation_tokens_total", model_name="soak") == totals["completion"]
    )
    for app in (served_app, broken_app):
        state = app.state.tessel
        assert (state.num_in_flight, state.num_queued, state.num_queued_tokens) == (0, 0, 0)
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0
