"""Every metric name the dashboard, the alert rules, the HPA and the README use is one the
server really exports (read from a live scrape, after requests gave every family samples)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tessel.engine import AsyncEngine
from tessel.server.metrics import MOE_FAMILIES
from tests.server.conftest import wait_until_idle

pytestmark = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\btessel_[a-z0-9_]+")


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "tessel.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


def rule_exprs() -> list[str]:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


async def exported(client: httpx.AsyncClient) -> tuple[set[str], set[str]]:
    """(sample names, family names) of a scrape."""
    text = (await client.get("/metrics")).text
    families = list(text_string_to_metric_families(text))
    names = {f.name for f in families if not f.name.endswith("_created")}  # timestamps
    return {s.name for f in families for s in f.samples}, names


async def test_deploy_files_use_only_exported_names(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "n": 2})
    await client.post("/v1/completions", json={"prompt": 5})  # a rejection-free 400
    await wait_until_idle(engine)
    samples, _ = await exported(client)
    sources = {
        "dashboard": " ".join(dashboard_exprs()),
        "alerts": " ".join(rule_exprs()),
        "hpa": (ROOT / "deploy" / "k8s" / "hpa.yaml").read_text(),
    }
    for where, text in sources.items():
        used = set(NAME.findall(text))
        assert used, where
        missing = used - samples
        assert not missing, f"{where} uses names the server does not export: {missing}"
    dashboard = sources["dashboard"]
    for needed in (
        "time_to_first_token",
        "time_per_output_token",
        "inter_token_latency",
        "generation_tokens_total",
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "engine_step_stage_seconds_total",
    ):
        assert f"tessel_{needed}" in dashboard, needed


async def test_readme_metric_table_is_the_exported_list(client: httpx.AsyncClient) -> None:
    await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    _, families = await exported(client)
    readme = (ROOT / "README.md").read_text()
    table = set(re.findall(r"^\| `(tessel_[a-z0-9_]+)` \|", readme, re.MULTILINE))
    # prometheus_client names a counter family without its _total suffix
    listed = {name.removesuffix("_total") for name in table}
    # the default model is dense: the MoE families are listed but exported only by a MoE model
    # (tests/server/test_moe_metrics.py scrapes them)
    assert listed == families | set(MOE_FAMILIES), listed ^ (families | set(MOE_FAMILIES))
    assert not families & set(MOE_FAMILIES)
