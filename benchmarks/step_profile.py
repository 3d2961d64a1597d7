"""Where an engine step's time goes under the online benchmark's load, offline: all of
serve.py's ShareGPT-like requests added at once (QPS inf), stepped one by one.

Per step it records the tokens scheduled and the wall time since the previous step; the table
splits the run into pure-decode steps (graph replays) and steps with a prefill (eager). A window
of steps runs under torch.profiler: the top GPU kernels, and host time
against GPU time, say whether those steps wait on the host's launches or on the GPU.

    PYTHONPATH=. python3 benchmarks/step_profile.py [--model Llama-3.1-8B] [--num 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.report import emit
from benchmarks.serve import sharegpt_like_lengths
from benchmarks.throughput import warm_dummy_llm, workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Llama-3.1-8B")
    ap.add_argument("--num", type=int, default=1000)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--profile-from", type=int, default=200, help="first step of the profiled window")
    ap.add_argument("--profile-steps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from tessel.engine import SamplingParams

    core = warm_dummy_llm(args.model, max_model_len=4096, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens).core
    prompts, _ = workload(args.num, 100, 1024)
    pairs = sharegpt_like_lengths(args.num, seed=0)
    for i, (p, (n, m)) in enumerate(zip(prompts, pairs, strict=True)):
        core.add_request(str(i), (p * (n // len(p) + 1))[:n], SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True))

    steps: list[tuple[int, float]] = []  # (tokens scheduled, wall s since the previous step)
    cuda = torch.cuda.is_available()
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    window = range(args.profile_from, args.profile_from + args.profile_steps)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = last = time.perf_counter()
    while core.has_unfinished():
        if len(steps) == window.start:
            prof.__enter__()
        core.step()
        if len(steps) == window.stop - 1:
            sync()
            prof.__exit__(None, None, None)
        now = time.perf_counter()
        steps.append((core.scheduler.stats.num_scheduled_tokens, now - last))
        last = now
    total = time.perf_counter() - start

    lines = [f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}; {args.model} random bf16; {args.num} ShareGPT-like requests at once; "
             f"max_num_seqs {args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}",
             f"{total:.2f} s, {len(steps)} steps, {args.num / total:.1f} req/s", "",
             "| steps | count | mean tokens | mean wall ms | median wall ms | share of wall |", "|---|---|---|---|---|---|"]
    # A step with more tokens than sequences running has a prefill in it (and runs eagerly).
    for name, keep in (("decode only (tokens <= max_num_seqs)", lambda s: s[0] <= args.max_num_seqs),
                       ("with prefill", lambda s: s[0] > args.max_num_seqs)):
        sel = [s for s in steps if keep(s)]
        if sel:
            walls = [s[1] for s in sel]
            lines.append(f"| {name} | {len(sel)} | {statistics.mean(s[0] for s in sel):.0f} | {1e3 * statistics.mean(walls):.1f} | "
                         f"{1e3 * statistics.median(walls):.1f} | {100 * sum(walls) / total:.0f}% |")
    lines.append(f"graph steps {core.step_stats.graph_steps} of {len(steps)}")
    profiled = steps[window.start:window.stop]
    if len(profiled) == len(window):
        events = prof.key_averages()
        gpu_us = sum(e.self_device_time_total for e in events)
        lines += ["", f"profiled steps {window.start}-{window.stop - 1}: mean tokens {statistics.mean(s[0] for s in profiled):.0f}, "
                  f"wall {1e3 * sum(s[1] for s in profiled):.1f} ms, GPU kernels {gpu_us / 1e3:.1f} ms", "",
                  "| top GPU ops (self) | calls | GPU ms | share |", "|---|---|---|---|"]
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:15]:
            lines.append(f"| {e.key[:70]} | {e.count} | {e.self_device_time_total / 1e3:.2f} | "
                         f"{100 * e.self_device_time_total / max(gpu_us, 1):.0f}% |")
        lines += ["", "| top host ops (self CPU) | calls | CPU ms |", "|---|---|---|"]
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
            lines.append(f"| {e.key[:70]} | {e.count} | {e.self_cpu_time_total / 1e3:.2f} |")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
