"""The HTTP API over a tensor-parallel engine (2 ranks, gloo, a real worker process): greedy
completions equal a one-rank engine's, and /metrics reports the size and the KV of both ranks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessel.engine import AsyncEngine
from tessel.server.app import build_app
from tessel.server.settings import ServerSettings
from tests.checkpoints import write_tiny_checkpoint
from tests.server.conftest import serving

PROMPTS = ["Hello world", "The quick brown fox", "Serving language models:"]


async def completions(settings: ServerSettings) -> tuple[list[str], dict[str, float]]:
    """Each prompt's greedy text (sent concurrently, so they share batches) and the metrics."""
    engine = await asyncio.to_thread(AsyncEngine.from_config, settings.engine_config())
    await engine.start()
    try:
        async with serving(build_app(settings, engine)) as client:
            bodies = [
                {"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": True} for p in PROMPTS
            ]
            replies = await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))
            texts = [r.json()["choices"][0]["text"] for r in replies]
            scrape = (await client.get("/metrics")).text
    finally:
        await engine.shutdown()
    metrics = {s.name: s.value for f in text_string_to_metric_families(scrape) for s in f.samples}
    return texts, metrics


async def test_tp2_server_matches_tp1(tmp_path: Path) -> None:
    directory = str(write_tiny_checkpoint(tmp_path, "llama"))  # 4 query heads, 2 KV heads
    common = {"model": directory, "num_blocks": 64, "block_size": 4}
    expected, one = await completions(ServerSettings(**common))
    got, two = await completions(ServerSettings(**common, tensor_parallel_size=2))
    assert got == expected
    assert all(expected)
    assert one["tessel_tensor_parallel_size"] == 1 and two["tessel_tensor_parallel_size"] == 2
    # one KV head per rank instead of two on one: the same bytes, now spread over both ranks
    assert two["tessel_kv_cache_memory_bytes"] == one["tessel_kv_cache_memory_bytes"] > 0
    assert two["tessel_kv_cache_blocks_capacity"] == one["tessel_kv_cache_blocks_capacity"]
    assert two["tessel_generation_tokens_total"] == 12 * len(PROMPTS)


@pytest.fixture(autouse=True)
def _no_leftover_group() -> Iterator[None]:
    import torch.distributed as dist

    yield
    assert not dist.is_initialized()  # the engine's shutdown tore the group down
