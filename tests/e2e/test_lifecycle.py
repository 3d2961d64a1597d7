"""Process-level behaviour: a killed client frees its KV blocks; SIGTERM drains and exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import API_KEY, ServerProcess, start_server, stop_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def gauges(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def wait_for(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


STREAMING_CLIENT = """
import sys, httpx
body = {"prompt": "Tell me a very long story.", "max_tokens": 400, "ignore_eos": True, "stream": True}
with httpx.stream("POST", sys.argv[1] + "/v1/completions", json=body, headers={"Authorization": sys.argv[2]},
                  timeout=120) as r:
    for line in r.iter_lines():
        if line.startswith("data: "):
            print(line[:20], flush=True)
"""


def test_killed_client_leaves_no_kv_block(server: ServerProcess) -> None:
    idle_blocks = gauges(server)["tessel_kv_cache_blocks_used"]
    client = subprocess.Popen(
        [sys.executable, "-c", STREAMING_CLIENT, server.base_url, HEADERS["Authorization"]],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(3):  # mid-stream: a few tokens have arrived
            assert client.stdout is not None and client.stdout.readline().startswith("data: ")
        assert gauges(server)["tessel_kv_cache_blocks_used"] > idle_blocks
        assert gauges(server)["tessel_num_requests_running"] == 1
    finally:
        client.kill()
        client.wait()
    assert wait_for(lambda: gauges(server)["tessel_num_requests_running"] == 0, timeout_s=15)
    assert gauges(server)["tessel_kv_cache_blocks_used"] == idle_blocks
    finished = gauges(server)
    assert finished.get("tessel_requests_finished_total", 0) >= 1  # the abort was counted


@pytest.mark.slow
def test_sigterm_drains_then_exits_zero(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--drain-timeout-s", "120")
    try:
        body = {"prompt": "Count slowly:", "max_tokens": 24, "ignore_eos": True, "stream": True}
        frames: list[str] = []
        with httpx.stream(
            "POST", f"{srv.base_url}/v1/completions", json=body, headers=HEADERS, timeout=120
        ) as r:
            lines = r.iter_lines()
            frames.append(next(line for line in lines if line.startswith("data: ")))
            srv.process.send_signal(signal.SIGTERM)
            assert wait_for(
                lambda: httpx.get(f"{srv.base_url}/ready", timeout=5).status_code == 503, 10
            )
            refused = httpx.post(
                f"{srv.base_url}/v1/completions", json={"prompt": "x"}, headers=HEADERS, timeout=10
            )
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
            frames += [line for line in lines if line.startswith("data: ")]
        assert frames[-1] == "data: [DONE]"
        chunks = [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]
        assert (
            chunks[-1]["choices"][0]["finish_reason"] == "length"
        )  # the request in flight finished
        assert srv.process.wait(timeout=60) == 0, srv.log()
        assert "draining 1 request" in srv.log()
    finally:
        stop_server(srv)
