"""/metrics moves with the requests served: counters equal the usage the API returned."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from tessel.engine import AsyncEngine
from tests.promtool import needs_promtool, promtool
from tests.server.conftest import serving, wait_until_idle

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_counters_equal_usage(make_app: Callable[..., FastAPI], engine: AsyncEngine) -> None:
    app = make_app(served_model_name="m")
    async with serving(app) as c:
        before = await scrape(c)
        assert value(before, "tessel_prompt_tokens_total", model_name="m") == 0
        requests = [
            (
                "/v1/completions",
                {"prompt": ["Hello", "The sky is"], "max_tokens": 5, "n": 2, "ignore_eos": True},
            ),
            (
                "/v1/chat/completions",
                {
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 4,
                    "ignore_eos": True,
                },
            ),
            (
                "/v1/completions",
                {"prompt": "Count: 1, 2,", "max_tokens": 20, "temperature": 0, "stop": ","},
            ),
        ]
        prompt = completion = 0
        reasons: dict[str, int] = {}
        for path, body in requests:
            r = (await c.post(path, json=body)).json()
            prompt += r["usage"]["prompt_tokens"]
            completion += r["usage"]["completion_tokens"]
            for choice in r["choices"]:
                reasons[choice["finish_reason"]] = reasons.get(choice["finish_reason"], 0) + 1
        assert reasons == {"length": 5, "stop": 1}
        after = await scrape(c)
    assert value(after, "tessel_prompt_tokens_total", model_name="m") == prompt
    assert value(after, "tessel_generation_tokens_total", model_name="m") == completion
    for reason, count in reasons.items():
        assert (
            value(after, "tessel_requests_finished_total", model_name="m", finished_reason=reason)
            == count
        )
    engine_requests = 4  # two prompts, one chat, one more completion
    for histogram in (
        "tessel_time_to_first_token_seconds",
        "tessel_e2e_request_latency_seconds",
        "tessel_request_queue_time_seconds",
        "tessel_request_prompt_tokens",
    ):
        assert value(after, f"{histogram}_count", model_name="m") == engine_requests, histogram
    assert value(after, "tessel_request_generation_tokens_sum", model_name="m") == completion
    # each of the 4 engine requests has (steps - 1) gaps: 4, 3 and the stopped one's
    assert value(after, "tessel_inter_token_latency_seconds_count", model_name="m") >= 4 + 4 + 3
    assert (
        value(after, "tessel_time_per_output_token_seconds_count", model_name="m")
        == engine_requests
    )
    assert value(after, "tessel_e2e_request_latency_seconds_sum", model_name="m") > 0


async def test_engine_gauges_and_counters_are_exported(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 2})
    await wait_until_idle(engine)
    samples = await scrape(client)
    stats = engine.stats()
    name = engine.model_name
    assert (
        value(samples, "tessel_kv_cache_blocks_capacity", model_name=name) == stats.kv_blocks_total
    )
    assert value(samples, "tessel_kv_cache_blocks_used", model_name=name) == stats.kv_blocks_used
    assert value(samples, "tessel_kv_cache_usage_perc", model_name=name) == pytest.approx(
        stats.kv_usage
    )
    assert value(samples, "tessel_num_requests_running", model_name=name) == 0
    assert (
        value(samples, "tessel_prefix_cache_queries_total", model_name=name)
        == stats.prefix_cache_queries_total
        > 0
    )
    assert ("tessel_num_preemptions_total", (("model_name", name),)) in samples
    # The step counters may still move after the scrape (a step that was in flight): bracket them.
    before, samples, after = stats, await scrape(client), engine.stats()
    for metric, attr in [
        ("tessel_engine_steps_total", "steps_total"),
        ("tessel_engine_gpu_idle_seconds_total", "gpu_idle_seconds_total"),
        ("tessel_engine_cuda_graph_steps_total", "cuda_graph_steps_total"),
        ("tessel_engine_wasted_tokens_total", "wasted_tokens_total"),
    ]:
        assert getattr(before, attr) <= value(samples, metric, model_name=name) <= getattr(after, attr)
    assert before.steps_total > 0
    assert ("tessel_engine_decode_plan_imbalance", (("model_name", name),)) in samples


async def test_each_app_has_its_own_registry(make_app: Callable[..., FastAPI]) -> None:
    a, b = make_app(served_model_name="a"), make_app(served_model_name="b")
    assert a.state.tessel.metrics.registry is not b.state.tessel.metrics.registry


@needs_promtool
async def test_promtool_finds_nothing_to_fix(client: httpx.AsyncClient) -> None:
    """A scrape with samples in every family passes ``promtool check metrics`` (its lint)."""
    for body in (
        {"prompt": "Hello", "max_tokens": 3},
        {"prompt": ["One", "Two"], "max_tokens": 2, "n": 2, "stream": True},
    ):
        assert (await client.post("/v1/completions", json=body)).status_code == 200
    text = (await client.get("/metrics")).text
    assert "tessel_time_to_first_token_seconds_count" in text  # histograms have samples
    assert "tessel_generation_tokens_total" in text
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0 and checked.stdout.strip() == "", checked.stdout
