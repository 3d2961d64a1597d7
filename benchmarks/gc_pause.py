"""The garbage collector's pauses in the engine loop, with the startup heap frozen and without.

Each variant runs in its own process (``TESSEL_GC_FREEZE=1`` / ``0``) on the same workload:
``--num`` requests with prompts and outputs uniform in [lo, hi], all added at once and stepped
through ``--max-num-seqs`` at a time, so requests finish and new ones start as when serving.
Per step it records the wall time of ``EngineCore.step`` and, through ``gc.callbacks``, the time
spent in collections of each generation.

    PYTHONPATH=. python3 benchmarks/gc_pause.py [--model DIR_OR_PRESET] [--out FILE]

Without ``--model`` it writes benchmarks/tiny_model.py's model to a temporary directory: on a
CPU its steps are short enough that the host loop, not the model, is what is measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.report import emit


def measure(args: argparse.Namespace) -> dict[str, float]:
    from benchmarks.throughput import warm_dummy_llm, workload
    from tessel.engine import SamplingParams

    core = warm_dummy_llm(args.model, max_model_len=2048, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens).core
    pauses = [0.0, 0.0, 0.0]
    counts = [0, 0, 0]
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]] += time.perf_counter() - started[0]
            counts[info["generation"]] += 1

    prompts, outputs = workload(args.num, args.lo, args.hi, seed=0)
    for i, (p, n) in enumerate(zip(prompts, outputs, strict=True)):
        core.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    gc.callbacks.append(on_gc)
    steps: list[float] = []
    tokens = 0
    start = time.perf_counter()
    while core.has_unfinished() and len(steps) < args.max_steps:
        t = time.perf_counter()
        outs = core.step()
        steps.append(time.perf_counter() - t)
        tokens += sum(len(c.token_ids) for o in outs for c in o.outputs)
    elapsed = time.perf_counter() - start
    gc.callbacks.remove(on_gc)
    steps.sort()
    ms = [s * 1e3 for s in steps]
    return {
        "steps": len(steps), "tok_s": tokens / elapsed, "p50": statistics.median(ms),
        "p99": ms[int(0.99 * (len(ms) - 1))], "max": ms[-1], "mean": statistics.fmean(ms),
        "gen2_n": counts[2], "gen2_ms": pauses[2] * 1e3, "gen01_ms": (pauses[0] + pauses[1]) * 1e3,
        "objects_tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a preset or checkpoint dir (default: a tiny model)")
    ap.add_argument("--num", type=int, default=1024)
    ap.add_argument("--lo", type=int, default=32)
    ap.add_argument("--hi", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--max-steps", type=int, default=1500)
    ap.add_argument("--repeats", type=int, default=2, help="runs per variant, interleaved")
    ap.add_argument("--warm-up-runs", type=int, default=1, help="first runs whose rows are dropped")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            subprocess.run([sys.executable, "benchmarks/tiny_model.py", tmp], check=True)
        model = args.model or tmp
        forwarded = [f"--{k}={getattr(args, k.replace('-', '_'))}" for k in
                     ("num", "lo", "hi", "max-num-seqs", "max-num-batched-tokens", "max-steps")]
        rows: list[tuple[str, dict[str, float]]] = []
        # A first, dropped run fills Triton's disk cache: on a fresh machine the first process
        # compiles every kernel inside its steps, and its row would measure that instead.
        for i, freeze in enumerate(["1"] * args.warm_up_runs + ["1", "0"] * args.repeats):
            path = os.pathsep.join(p for p in (".", os.environ.get("PYTHONPATH", "")) if p)
            env = {**os.environ, "TESSEL_GC_FREEZE": freeze, "PYTHONPATH": path}
            child = subprocess.run([sys.executable, __file__, "--child", "--model", model, *forwarded],
                                   env=env, capture_output=True, text=True)
            if child.returncode:
                sys.exit(f"the {freeze=} run failed:\n{child.stderr[-3000:]}")
            out = child.stdout
            if i >= args.warm_up_runs:
                rows.append(("frozen" if freeze == "1" else "not frozen", json.loads(out.strip().splitlines()[-1])))
    lines = [
        f"model {args.model or 'tiny (benchmarks/tiny_model.py)'}, {args.num} requests, in/out uniform "
        f"[{args.lo}, {args.hi}], max_num_seqs {args.max_num_seqs}",
        "",
        "| startup heap | steps | step ms p50 | p99 | max | mean | output tok/s | full collections | "
        "their ms | gen 0-1 ms | tracked objects |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['steps']} | {r['p50']:.2f} | {r['p99']:.2f} | {r['max']:.1f} | {r['mean']:.2f} | "
            f"{r['tok_s']:.0f} | {r['gen2_n']} | {r['gen2_ms']:.1f} | {r['gen01_ms']:.1f} | {r['objects_tracked']:,} |"
        )
    frozen = [r for n, r in rows if n == "frozen"]
    thawed = [r for n, r in rows if n == "not frozen"]
    lines += ["", f"max step, not frozen / frozen: "
              f"{statistics.fmean(r['max'] for r in thawed) / statistics.fmean(r['max'] for r in frozen):.1f}x; "
              f"time in full collections per run: {statistics.fmean(r['gen2_ms'] for r in thawed):.0f} ms "
              f"against {statistics.fmean(r['gen2_ms'] for r in frozen):.1f} ms"]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
