"""/metrics of a mixture-of-experts model exports its expert load: one counter series per expert
(summing to the tokens routed) and the last step's imbalance gauge."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessel.engine import AsyncEngine
from tessel.server.app import build_app
from tessel.server.metrics import MOE_FAMILIES
from tessel.server.settings import ServerSettings
from tests.checkpoints import write_tiny_checkpoint
from tests.server.conftest import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _settled(engine: AsyncEngine) -> None:
    last = None
    for _ in range(250):
        stats = engine.stats()
        now = (stats.num_running, stats.num_waiting, tuple(stats.expert_tokens_total or ()))
        if now == last and not engine.core.has_unfinished():
            return
        last = now
        await asyncio.sleep(0.02)
    raise AssertionError("the engine did not settle")


async def test_moe_metrics_are_scraped(tmp_path: Path) -> None:
    settings = ServerSettings(model=str(write_tiny_checkpoint(tmp_path, "qwen3_moe")), num_blocks=64)
    engine = await asyncio.to_thread(AsyncEngine.from_config, settings.engine_config())
    await engine.start()
    try:
        async with serving(build_app(settings, engine)) as client:
            body = {"prompt": "Hello world", "max_tokens": 4, "ignore_eos": True}
            assert (await client.post("/v1/completions", json=body)).status_code == 200
            await _settled(engine)  # a step may still be routing tokens after the response
            text = (await client.get("/metrics")).text
        stats = engine.stats()
    finally:
        await engine.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(MOE_FAMILIES) <= set(families)
    routed = {s.labels["expert"]: s.value for s in families[MOE_FAMILIES[0]].samples if s.name.endswith("_total")}
    assert sorted(routed, key=int) == [str(e) for e in range(8)]  # one series per expert
    assert sum(routed.values()) == sum(stats.expert_tokens_total) > 0
    (imbalance,) = families[MOE_FAMILIES[1]].samples
    assert imbalance.value == stats.expert_load_imbalance >= 1.0
