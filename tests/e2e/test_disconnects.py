"""1,000 clients that vanish at random points, over real TCP on loopback: while the body is
sent, before the first token (during prefill), mid-stream, or while a non-streamed answer is
computed; by FIN or by RST. Afterwards: no request running or waiting, no KV block held."""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import struct
import time
from urllib.parse import urlsplit

import httpx

from tests.e2e.conftest import API_KEY, ServerProcess
from tests.e2e.test_lifecycle import finished_total, gauges, wait_for

NUM_CLIENTS = 1000
CONCURRENCY = 32
MODES = ("mid_upload", "after_send", "mid_stream", "non_stream")
LOG_LINE = re.compile(r"^\S+ \S+ [A-Z]+ \S+ \[[^\]\s]+\] ")


def request_bytes(body: dict[str, object], cut: float = 1.0) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: tessel\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    return head + payload[: int(len(payload) * cut)]


async def vanish(host: str, port: int, rng: random.Random, mode: str) -> None:
    """One client: send, wait for its moment, then close (gracefully or with a reset)."""
    reader, writer = await asyncio.open_connection(host, port)
    stream = mode in ("mid_upload", "after_send", "mid_stream")
    body = {
        "prompt": f"Request {rng.randrange(10**6)}: tell me about the sea.",
        "max_tokens": 16,
        "ignore_eos": True,
        "stream": stream,
        "n": rng.choice((1, 1, 2)),
    }
    try:
        writer.write(request_bytes(body, cut=0.5 if mode == "mid_upload" else 1.0))
        await writer.drain()
        if mode == "after_send":
            await asyncio.sleep(rng.uniform(0, 0.05))  # before the first token: in prefill
        elif mode == "mid_stream":
            frames = rng.randint(1, 6)
            seen = b""
            while seen.count(b"data: ") < frames and not reader.at_eof():
                seen += await reader.read(4096)
        elif mode == "non_stream":
            await asyncio.sleep(rng.uniform(0, 0.3))
    finally:
        if rng.random() < 0.5:  # RST instead of FIN
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()


async def run_clients(base_url: str, seed: int) -> dict[str, int]:
    parts = urlsplit(base_url)
    assert parts.hostname == "127.0.0.1"
    rng = random.Random(seed)
    gate = asyncio.Semaphore(CONCURRENCY)
    counts = dict.fromkeys(MODES, 0)

    async def client(index: int) -> None:
        mode = MODES[index % len(MODES)]
        counts[mode] += 1
        async with gate:
            await asyncio.wait_for(vanish(parts.hostname, parts.port, rng, mode), timeout=60)

    await asyncio.gather(*(client(i) for i in range(NUM_CLIENTS)))
    return counts


def test_a_thousand_vanishing_clients_leave_nothing_behind(server: ServerProcess) -> None:
    idle_blocks = gauges(server)["tessel_kv_cache_blocks_used"]
    aborts_before = finished_total(server, "abort")
    start = time.monotonic()
    counts = asyncio.run(run_clients(server.base_url, seed=6))
    elapsed = time.monotonic() - start
    assert sum(counts.values()) == NUM_CLIENTS and min(counts.values()) == NUM_CLIENTS // 4

    def settled() -> bool:
        g = gauges(server)
        return (
            g["tessel_num_requests_running"] == 0
            and g["tessel_num_requests_waiting"] == 0
            and g["tessel_api_requests_in_flight"] == 0
        )

    assert wait_for(settled, timeout_s=30), gauges(server)
    g = gauges(server)
    assert g["tessel_kv_cache_blocks_used"] == idle_blocks
    assert g["tessel_api_requests_queued"] == 0 and g["tessel_api_queued_prompt_tokens"] == 0
    assert (
        finished_total(server, "abort") - aborts_before >= NUM_CLIENTS // 4
    )  # they really were aborted
    r = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"prompt": "Hello", "max_tokens": 3},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    log = server.log()
    assert "Traceback" not in log, log[-3000:]
    # every line, uvicorn's too, carries a request id field ("-" outside a request)
    lines = [line for line in log.splitlines() if line.strip()]
    unformatted = [line for line in lines if not LOG_LINE.match(line)]
    assert not unformatted, unformatted[:5]
    assert sum(" [req-" in line and "abort" in line for line in lines) >= NUM_CLIENTS // 4
    print(f"{NUM_CLIENTS} disconnects in {elapsed:.1f} s")
