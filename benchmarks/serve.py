"""Serving benchmark for any OpenAI-compatible server, and Tessel's HTTP overhead.

Load mode: random prompts of given lengths, streamed, arriving as a Poisson process at
``--request-rate`` (inf: all at once) and/or capped at ``--max-concurrency``. Reports TTFT,
TPOT, ITL and end-to-end latency (mean, p50, p90, p99), request and token throughput, and
goodput under SLOs, with the definitions of vLLM's serving benchmark:
  TTFT  send -> first chunk with text;   ITL  each gap between chunks with text;
  TPOT  (e2e - TTFT) / (output tokens - 1) per request;   goodput  requests/s meeting every SLO.

    python benchmarks/serve.py --base-url http://127.0.0.1:8000 --num-prompts 64 --request-rate 4

Overhead mode: starts ``tessel serve``, sends ``--concurrency`` streams through HTTP, then
runs the same requests through the offline ``engine.LLM`` in this process; prints both
output-token throughputs and their ratio (Tessel's target: HTTP >= 90% of offline).

    python benchmarks/serve.py --overhead --concurrency 32 --input-len 64 --output-len 64

The client is aiohttp, as in vLLM's serving benchmark: its C HTTP parser costs ~55 us of client
CPU per streamed token on this project's CPU machine, against ~210 us for httpx (h11), which
had one client process saturating near 7k tok/s on the H200 host (``serve_cpu.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
    "matches",
]
PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """One streamed request as the client saw it (seconds, from its send)."""

    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    text: str = ""
    error: str = ""

    @property
    def tpot(self) -> float:
        return (
            (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0
        )


def make_prompts(n: int, input_len: int, range_ratio: float, seed: int, as_text: bool) -> list[Any]:
    """Token-id prompts (exact lengths; ids in [1000, 10000) avoid special tokens of common
    vocabularies) or, with ``as_text``, that many random words."""
    rng = random.Random(seed)
    lo, hi = max(1, int(input_len * (1 - range_ratio))), max(1, int(input_len * (1 + range_ratio)))
    lengths = [rng.randint(lo, hi) for _ in range(n)]
    if as_text:
        return [" ".join(rng.choice(WORDS) for _ in range(k)) for k in lengths]
    return [[rng.randrange(1000, 10000) for _ in range(k)] for k in lengths]


def sharegpt_like_lengths(n: int, seed: int) -> list[tuple[int, int]]:
    """(input, output) token lengths drawn to resemble ShareGPT conversations: log-normal, long
    tailed, medians 128 in and 128 out, clipped to [4, 1024] (synthetic: no data set here)."""
    rng = random.Random(seed)
    clip = lambda x: int(min(1024, max(4, x)))  # noqa: E731
    return [(clip(rng.lognormvariate(4.85, 1.0)), clip(rng.lognormvariate(4.85, 0.8))) for _ in range(n)]


def request_body(args: argparse.Namespace, prompt: Any, max_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": args.model,
        "max_tokens": max_tokens or args.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.endpoint == "chat":
        return {**body, "messages": [{"role": "user", "content": prompt}]}
    return {**body, "prompt": prompt}


async def send(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], prompt_len: int
) -> RequestResult:
    """Stream one request, timing every chunk that carries text."""
    result = RequestResult(ok=False, prompt_len=prompt_len)
    start = last = time.perf_counter()
    chunks, texts = 0, []
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.read())[:200]!r}"
                return result
            pending = b""
            async for data in response.content.iter_any():
                *events, pending = (pending + data).split(b"\n\n")
                for event in events:
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    chunk = json.loads(event[6:])
                    if chunk.get("usage"):
                        result.output_tokens = chunk["usage"]["completion_tokens"]
                    for choice in chunk.get("choices", ()):
                        text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                        if not text:
                            continue
                        now = time.perf_counter()
                        if chunks == 0:
                            result.ttft = now - start
                        else:
                            result.itl.append(now - last)
                        last, chunks = now, chunks + 1
                        texts.append(text)
        result.latency = time.perf_counter() - start
        result.text = "".join(texts)
        result.output_tokens = result.output_tokens or chunks
        result.ok = chunks > 0
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as err:
        result.error = f"{type(err).__name__}: {err}"
    return result


async def run_load(
    args: argparse.Namespace, prompts: list[Any], output_lens: list[int] | None = None
) -> tuple[list[RequestResult], float, float]:
    """Send every prompt: Poisson arrivals at ``request_rate``, at most ``max_concurrency`` open.
    Returns the results, the wall seconds and this client's CPU seconds over the run (a client
    near one CPU second per second is itself the bottleneck, not the server)."""
    path = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limit = args.max_concurrency or len(prompts)
    gate = asyncio.Semaphore(limit)
    rng = random.Random(args.seed + 1)
    async with aiohttp.ClientSession(
        base_url=args.base_url, headers=headers, timeout=aiohttp.ClientTimeout(total=None),
        connector=aiohttp.TCPConnector(limit=limit),
    ) as session:

        async def one(prompt: Any, max_tokens: int | None) -> RequestResult:
            async with gate:
                n = len(prompt) if isinstance(prompt, list) else len(prompt.split())
                return await send(session, path, request_body(args, prompt, max_tokens), n)

        start, cpu_start = time.perf_counter(), time.process_time()
        tasks = []
        for i, prompt in enumerate(prompts):
            tasks.append(asyncio.create_task(one(prompt, output_lens[i] if output_lens else None)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start, time.process_time() - cpu_start


def served_model(base_url: str, api_key: str | None) -> str:
    """The first model ``/v1/models`` lists."""
    request = urllib.request.Request(f"{base_url}/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.load(response)["data"][0]["id"])


def describe(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """Mean and percentiles, in milliseconds by default."""
    if not values:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}}
    ordered = sorted(values)
    pick = {
        f"p{p}": ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * scale
        for p in PERCENTILES
    }
    return {"mean": statistics.fmean(values) * scale, **pick}


def summarize(
    results: list[RequestResult], duration: float, slo_ms: dict[str, float], client_cpu_s: float | None = None
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in ok)
    good = [
        r
        for r in ok
        if r.ttft * 1000 <= slo_ms.get("ttft", float("inf"))
        and r.tpot * 1000 <= slo_ms.get("tpot", float("inf"))
        and r.latency * 1000 <= slo_ms.get("e2el", float("inf"))
    ]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_throughput": output / duration,
        "total_token_throughput": (output + sum(r.prompt_len for r in ok)) / duration,
        "goodput": len(good) / duration if slo_ms else None,
        "slo_ms": slo_ms,
        "ttft_ms": describe([r.ttft for r in ok]),
        "tpot_ms": describe([r.tpot for r in ok if r.output_tokens > 1]),
        "itl_ms": describe([gap for r in ok for gap in r.itl]),
        "e2el_ms": describe([r.latency for r in ok]),
        "client_cpu_share": None if client_cpu_s is None else client_cpu_s / duration,
        # below 1 when the server merges a lagging stream's tokens into fewer SSE chunks
        "chunks_per_token": sum(len(r.itl) + 1 for r in ok) / max(output, 1),
    }


def print_summary(s: dict[str, Any]) -> None:
    print(f"completed {s['completed']}  failed {s['failed']}  in {s['duration_s']:.2f} s")
    print(
        f"request throughput {s['request_throughput']:.2f} req/s   output {s['output_throughput']:.1f} tok/s   "
        f"total {s['total_token_throughput']:.1f} tok/s"
        + (f"   goodput {s['goodput']:.2f} req/s" if s["goodput"] is not None else "")
    )
    print(f"{'ms':>6} {'mean':>9} " + " ".join(f"{'p' + str(p):>9}" for p in PERCENTILES))
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        row = s[key]
        print(
            f"{key[:-3].upper():>6} {row['mean']:9.1f} "
            + " ".join(f"{row[f'p{p}']:9.1f}" for p in PERCENTILES)
        )
    if s.get("client_cpu_share") is not None:
        print(f"client CPU {s['client_cpu_share']:.0%} of one core over the run; "
              f"SSE chunks per output token {s['chunks_per_token']:.2f}")
    for error in s["errors"]:
        print("error:", error)


def plot(results: list[RequestResult], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for ax, (name, values) in zip(
        axes,
        [
            ("TTFT (ms)", [r.ttft * 1000 for r in results if r.ok]),
            ("ITL (ms)", [g * 1000 for r in results if r.ok for g in r.itl]),
            ("E2E latency (ms)", [r.latency * 1000 for r in results if r.ok]),
        ],
        strict=True,
    ):
        ax.hist(values, bins=40)
        ax.set_xlabel(name)
    fig.tight_layout()
    fig.savefig(path)
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="Server root (without /v1).")
    p.add_argument("--model", default=None, help="Model name to send (default: the server's).")
    p.add_argument("--api-key", default=None, help="Sent as 'Authorization: Bearer KEY'.")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument(
        "--input-len",
        type=int,
        default=128,
        help="Prompt tokens (words with --text-prompts or chat).",
    )
    p.add_argument("--output-len", type=int, default=64, help="max_tokens, with ignore_eos.")
    p.add_argument(
        "--range-ratio", type=float, default=0.0, help="Lengths uniform in len*(1 +- ratio)."
    )
    p.add_argument("--text-prompts", action="store_true", help="Random words instead of token ids.")
    p.add_argument(
        "--lengths", choices=["fixed", "sharegpt"], default="fixed",
        help="fixed: --input-len/--output-len (+- --range-ratio); sharegpt: synthetic ShareGPT-like.",
    )
    p.add_argument(
        "--request-rate", type=float, default=float("inf"), help="Poisson arrivals per second."
    )
    p.add_argument("--max-concurrency", type=int, default=None, help="Most requests open at once.")
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--slo-e2el-ms", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument(
        "--result-name", default=None, help="JSON file name (default: serve-<timestamp>.json)."
    )
    p.add_argument("--plot", action="store_true", help="Also save a PNG of the latency histograms.")
    p.add_argument(
        "--overhead", action="store_true", help="Tessel over HTTP vs the offline engine."
    )
    p.add_argument("--concurrency", type=int, default=32, help="Overhead mode: concurrent streams.")
    p.add_argument(
        "--max-model-len", type=int, default=1024, help="Overhead mode: the engine's context."
    )
    p.add_argument("--rounds", type=int, default=2, help="Overhead mode: alternating rounds of each side.")
    p.add_argument(
        "--engine-flag", action="append", default=[], metavar="KEY=VALUE",
        help="Overhead mode: an engine setting for both sides, e.g. model=DIR, load_format=dummy (repeatable).",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.result_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = args.result_name or f"serve-{time.strftime('%Y%m%d-%H%M%S')}.json"
    if args.overhead:
        from benchmarks.serve_overhead import overhead

        report = overhead(args)
    else:
        if args.model is None:
            args.model = served_model(args.base_url, args.api_key)
        as_text = args.text_prompts or args.endpoint == "chat"
        output_lens = None
        if args.lengths == "sharegpt":
            pairs = sharegpt_like_lengths(args.num_prompts, args.seed)
            rng = random.Random(args.seed)
            prompts = [[rng.randrange(1000, 10000) for _ in range(i)] for i, _ in pairs]
            output_lens = [o for _, o in pairs]
        else:
            prompts = make_prompts(
                args.num_prompts, args.input_len, args.range_ratio, args.seed, as_text
            )
        results, duration, client_cpu = asyncio.run(run_load(args, prompts, output_lens))
        slo = {
            k: v
            for k, v in (
                ("ttft", args.slo_ttft_ms),
                ("tpot", args.slo_tpot_ms),
                ("e2el", args.slo_e2el_ms),
            )
            if v
        }
        report = {
            "args": {k: v for k, v in vars(args).items() if k != "api_key"},
            **summarize(results, duration, slo, client_cpu),
            "requests": [asdict(r) | {"text": ""} for r in results],
        }
        print_summary(report)
        if args.plot and plot(results, out_dir / name.replace(".json", ".png")):
            print("plot:", out_dir / name.replace(".json", ".png"))
    (out_dir / name).write_text(json.dumps(report, indent=2, default=str))
    print("results:", out_dir / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
