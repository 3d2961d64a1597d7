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


def finished_total(server: ServerProcess, reason: str) -> float:
    """``tessel_requests_finished_total`` for one finish reason."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "tessel_requests_finished_total" and s.labels["finished_reason"] == reason:
                return float(s.value)
    return 0.0


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
    aborts = finished_total(server, "abort")
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
    assert finished_total(server, "abort") == aborts + 1  # the abort was counted


@pytest.mark.slow
@pytest.mark.parametrize("engine_process", ["off", "on"], ids=["in-process", "engine-process"])
def test_sigterm_drains_then_exits_zero(tmp_path: Path, engine_process: str) -> None:
    """The drain also holds with the engine in a child process (SIGTERM goes to the server's
    process alone, as Kubernetes sends it), and the child is gone after the exit."""
    srv = start_server(tmp_path, "--drain-timeout-s", "120", "--engine-process", engine_process)
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
        assert ("[engine] loaded" in srv.log()) == (engine_process == "on")
        assert "Traceback" not in srv.log()  # the child stopped when told, not killed mid-step
    finally:
        stop_server(srv)


async def _load_then_sigterm(srv: ServerProcess) -> tuple[list[str], float]:
    """Streams keep arriving; once 8 are in flight, SIGTERM; arrivals go on for 1.5 s.
    Each request's outcome: "done" (200, every token, [DONE]), "refused" (503 draining),
    "unreachable" (no status line: the listener had closed) or "lost" (200, cut short)."""
    import asyncio

    # Greedy: the "every token" check counts text chunks, and a random draw of multi-byte
    # characters (held back until complete) could leave a finished stream short of them.
    body = {"prompt": "Count slowly:", "max_tokens": 24, "ignore_eos": True, "stream": True, "temperature": 0}
    limits = httpx.Limits(max_keepalive_connections=0)  # each request on its own connection
    outcomes: list[str] = []
    started = asyncio.Event()
    in_flight = 0

    async def one(c: httpx.AsyncClient) -> None:
        nonlocal in_flight
        admitted = False
        try:
            async with c.stream("POST", "/v1/completions", json=body, headers=HEADERS) as r:
                if r.status_code == 503:
                    outcomes.append("refused")
                    return
                assert r.status_code == 200
                admitted = True  # stream headers go out once the request is admitted
                in_flight += 1
                if in_flight >= 8:
                    started.set()
                frames = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        except httpx.HTTPError:  # no answer at all is not admitted; a cut stream is lost
            outcomes.append("lost" if admitted else "unreachable")
            return
        chunks = [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]
        complete = (
            frames[-1] == "data: [DONE]"
            and chunks[-1]["choices"][0]["finish_reason"] == "length"
            and sum(1 for ch in chunks if ch["choices"][0]["text"]) >= 20
        )
        outcomes.append("done" if complete else "lost")

    async with httpx.AsyncClient(base_url=srv.base_url, timeout=120, limits=limits) as c:
        tasks = []
        signalled_at = None
        deadline = None
        while deadline is None or time.monotonic() < deadline:
            tasks.append(asyncio.create_task(one(c)))
            await asyncio.sleep(0.05)
            if started.is_set() and signalled_at is None:
                srv.process.send_signal(signal.SIGTERM)
                signalled_at = time.monotonic()
                deadline = signalled_at + 1.5
            assert len(tasks) < 400, "the load never reached 8 streams"
        await asyncio.gather(*tasks)
    assert signalled_at is not None
    return outcomes, signalled_at


@pytest.mark.slow
def test_sigterm_under_load_loses_no_admitted_request(tmp_path: Path) -> None:
    import asyncio

    srv = start_server(tmp_path, "--drain-timeout-s", "60")
    try:
        outcomes, signalled_at = asyncio.run(_load_then_sigterm(srv))
        code = srv.process.wait(timeout=70)
        exit_s = time.monotonic() - signalled_at
        counts = {o: outcomes.count(o) for o in set(outcomes)}
        print(f"SIGTERM under load: {counts}, exit {code} after {exit_s:.1f} s")
        assert counts.get("lost", 0) == 0, (counts, srv.log()[-2000:])
        assert counts.get("done", 0) >= 8 and counts.get("refused", 0) >= 1, counts
        assert code == 0 and exit_s < 60, srv.log()[-2000:]
    finally:
        stop_server(srv)
