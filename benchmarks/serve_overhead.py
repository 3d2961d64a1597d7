"""Tessel's HTTP overhead: the same requests through ``tessel serve`` and the offline engine.

Run through ``python benchmarks/serve.py --overhead ...`` (its arguments are parsed there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.serve import ROOT, make_prompts, print_summary, run_load, summarize


class TesselServer:
    """``tessel serve`` in a subprocess on a free loopback port, until the block ends."""

    def __init__(self, flags: dict[str, Any], log_path: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        cmd = [
            sys.executable,
            "-m",
            "tessel.server.cli",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        cmd += [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def __enter__(self) -> TesselServer:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tessel serve exited:\n{self.log_path.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/ready", timeout=1).status_code == 200:
                    return self
            time.sleep(0.5)
        raise RuntimeError("tessel serve not ready after 300 s")

    def cpu_seconds(self) -> float:
        """CPU time the server process has used so far, all its threads (Linux /proc)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def __exit__(self, *exc: object) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    """The same requests through ``tessel serve`` (HTTP, streaming) and the offline engine,
    alternated for ``--rounds`` rounds so that a busy machine slows both alike; best of each."""
    from tessel.engine import LLM, SamplingParams
    from tessel.server.settings import ServerSettings

    prompts = make_prompts(args.concurrency, args.input_len, 0.0, args.seed, as_text=False)
    # Warm-up with the full batch shape: the first batch of a new size is several times slower.
    warm = make_prompts(args.concurrency, args.input_len, 0.0, args.seed + 7, as_text=False)
    flags: dict[str, Any] = {"max_model_len": args.max_model_len, "max_num_seqs": max(args.concurrency, 1)}
    flags |= dict(flag.split("=", 1) for flag in args.engine_flag)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    llm = LLM(config=ServerSettings(**flags).engine_config())
    llm.generate(warm, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    rounds: list[dict[str, Any]] = []
    with TesselServer(flags, Path(tempfile.gettempdir()) / "tessel-overhead-server.log") as server:
        args.base_url, args.max_concurrency = server.base_url, args.concurrency
        args.request_rate, args.endpoint = float("inf"), "completions"
        output_len, args.output_len = args.output_len, 8
        asyncio.run(run_load(args, warm))
        args.output_len = output_len
        for _ in range(args.rounds):
            start, cpu_start = time.perf_counter(), time.process_time()
            outs = llm.generate(prompts, params)
            offline_s, offline_cpu = time.perf_counter() - start, time.process_time() - cpu_start
            server_cpu = server.cpu_seconds()
            results, duration, client_cpu = asyncio.run(run_load(args, prompts))
            server_cpu = server.cpu_seconds() - server_cpu
            offline_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            http = summarize(results, duration, {}, client_cpu)
            http_tokens = sum(r.output_tokens for r in results if r.ok)
            http["server_cpu_us_per_token"] = 1e6 * server_cpu / max(http_tokens, 1)
            same = sum(r.text == o.outputs[0].text for r, o in zip(results, outs, strict=True))
            rounds.append(
                {
                    "http": http,
                    "offline": {
                        "duration_s": offline_s,
                        "output_throughput": offline_tokens / offline_s,
                        "cpu_us_per_token": 1e6 * offline_cpu / offline_tokens,
                    },
                    "ratio": http["output_throughput"] / (offline_tokens / offline_s),
                    "identical_texts": same,
                }
            )
            print_summary(http)
            print(
                f"offline: {offline_tokens / offline_s:.1f} tok/s   HTTP/offline {rounds[-1]['ratio']:.1%}   "
                f"identical greedy texts {same}/{len(prompts)}\n"
                f"CPU us per output token: server {http['server_cpu_us_per_token']:.0f}, "
                f"offline engine {rounds[-1]['offline']['cpu_us_per_token']:.0f}\n"
            )
    best_http = max(r["http"]["output_throughput"] for r in rounds)
    best_offline = max(r["offline"]["output_throughput"] for r in rounds)
    report = {
        "concurrency": args.concurrency,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "rounds": rounds,
        "best_http_output_throughput": best_http,
        "best_offline_output_throughput": best_offline,
        "ratio": best_http / best_offline,
    }
    print(
        f"best of {args.rounds}: HTTP {best_http:.1f} tok/s, offline {best_offline:.1f} tok/s, "
        f"ratio {report['ratio']:.1%}"
    )
    return report
