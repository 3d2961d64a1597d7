"""Cold start: what a fresh process pays the first time it meets the workload's shapes.

Each case is its own process. ``cold`` runs with an empty Triton cache directory, ``warm`` reuses
the directory the cold run filled (what a second process on the same machine sees). Every Triton
specialization a process compiles (or loads from the disk cache) is logged with the moment it
happened, so the table says how many land inside the timed run rather than at engine start.

    PYTHONPATH=. python3 benchmarks/cold_start.py [--model Qwen3-0.6B] [--cases cold warm]
        [--engine-flag engine_warm_up=false]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.report import emit


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: engine start, then nano-vllm's workload once; compiles logged by phase."""
    import torch
    import triton

    from benchmarks.decode_roofline import use_gpu_dummy_weights
    from benchmarks.throughput import workload
    from tessel.engine import LLM, SamplingParams

    phase = "start"
    compiles: list[tuple[str, str, float]] = []
    t_proc = time.perf_counter()

    def hook(**kw: Any) -> bool:
        compiles.append((phase, kw["fn"].name, time.perf_counter() - t_proc))
        return False  # log only: compile as usual

    triton.knobs.runtime.jit_cache_hook = hook
    if torch.cuda.is_available():
        use_gpu_dummy_weights()
    flags = dict(_parse_flag(f) for f in args.engine_flag)
    t0 = time.perf_counter()
    llm = LLM(args.model, load_format="dummy", **flags)
    start_s = time.perf_counter() - t0
    prompts, outputs = workload(args.num, 100, 1024)
    params = [SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True) for n in outputs]
    phase = "run"
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t1 = time.perf_counter()
    outs = llm.generate(prompts, params)
    sync()
    run_s = time.perf_counter() - t1
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    in_run = [(name, round(at - (t1 - t_proc), 2)) for p, name, at in compiles if p == "run"]
    return {
        "start_s": start_s, "run_s": run_s, "tok_s": produced / run_s,
        "compiles_at_start": sum(p == "start" for p, _, _ in compiles),
        "compiles_in_run": len(in_run),
        "in_run_kernels": dict(Counter(name for name, _ in in_run)),
        "in_run_first_at_s": in_run[:20],
    }


def _parse_flag(flag: str) -> tuple[str, Any]:
    key, _, value = flag.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen3-0.6B")
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--cases", nargs="+", default=["cold", "warm"],
                    help="cold: empty Triton cache; warm: the cache the cold run filled. "
                         "NAME:flag=value,ENV=value adds engine flags (lower case) or environment "
                         "variables (upper case) to one case; NAME cold-... starts a new cache")
    ap.add_argument("--engine-flag", action="append", default=[], help="key=value for every case")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    cache = tempfile.mkdtemp(prefix="triton-cold-")
    rows = []
    for case in args.cases:
        name, _, extra = case.partition(":")
        kind = name.split("-")[0]
        if kind == "cold":
            cache = tempfile.mkdtemp(prefix="triton-cold-")
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        cmd = [sys.executable, __file__, "--child", "--model", args.model, "--num", str(args.num)]
        for flag in [*args.engine_flag, *filter(None, extra.split(","))]:
            key, _, value = flag.partition("=")
            if key.isupper():  # an environment variable for this case's process
                env[key] = value
            else:
                cmd += ["--engine-flag", flag]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            rows.append({"case": case, "error": proc.returncode})
            continue
        result = json.loads(lines[-1][len("RESULT "):])
        print(case, json.dumps(result), flush=True)
        rows.append({"case": case, **result})
    header = "| case | engine start s | run s | output tok/s | compiles at start | compiles in the run |\n|---|---|---|---|---|---|"
    body = [
        f"| {r['case']} | {r['start_s']:.1f} | {r['run_s']:.2f} | {r['tok_s']:.0f} | {r['compiles_at_start']} | {r['compiles_in_run']} |"
        if "error" not in r else f"| {r['case']} | failed ({r['error']}) | | | | |"
        for r in rows
    ]
    emit([header, *body], args.out)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
