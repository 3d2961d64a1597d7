"""Ablation on a mixed long-context workload (issue 5): everything on, then one switch off at a
time (balanced -> static split, overlap off, CUDA graphs off), then all off; one process, same data.

The default is the issue's workload: a few 64K-128K prompts among many short ones. ``--long-min
8192 --long-max 15000 --num 64 --num-long 8`` is the smaller one of the first results.

    PYTHONPATH=. python3 benchmarks/ablation.py --out ablation.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from random import Random

import torch

from benchmarks.decode_roofline import use_gpu_dummy_weights
from benchmarks.throughput import run

CASES = {
    "all on": {},
    "balanced -> static split": {"decode_split": "static"},
    "overlap off": {"overlap_scheduling": False},
    "graphs off": {"enforce_eager": True},
    "all off": {"decode_split": "static", "overlap_scheduling": False, "enforce_eager": True},
    "all on (again: order effects)": {},
}


def mixed(num: int, num_long: int, long_range: tuple[int, int], short_range: tuple[int, int],
          output_range: tuple[int, int], seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """``num`` random-id prompts, ``num_long`` of them (spread evenly) long, the rest short."""
    rng = Random(seed)
    long_at = {i * num // num_long for i in range(num_long)}
    lens = [rng.randint(*long_range) if i in long_at else rng.randint(*short_range) for i in range(num)]
    return [[rng.randint(0, 10000) for _ in range(n)] for n in lens], [rng.randint(*output_range) for _ in lens]


def graph_sizes(max_batch: int) -> list[int]:
    return sorted({1, 2, 4, 8, *range(16, max_batch + 1, 8), max_batch})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Llama-3.2-1B")
    ap.add_argument("--num", type=int, default=128)
    ap.add_argument("--num-long", type=int, default=4)
    ap.add_argument("--long-min", type=int, default=65536)
    ap.add_argument("--long-max", type=int, default=130000)
    ap.add_argument("--short-min", type=int, default=128)
    ap.add_argument("--short-max", type=int, default=1024)
    ap.add_argument("--output-min", type=int, default=64)
    ap.add_argument("--output-max", type=int, default=256)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    use_gpu_dummy_weights()
    prompts, outputs = mixed(args.num, args.num_long, (args.long_min, args.long_max),
                             (args.short_min, args.short_max), (args.output_min, args.output_max))
    base = dict(max_model_len=max(map(len, prompts)) + args.output_max, max_num_seqs=args.num,
                max_num_batched_tokens=8192, cuda_graph_batch_sizes=graph_sizes(args.num))
    results = {}
    rows = []
    for name in args.cases:
        r = results[name] = run(args.model, prompts, outputs, **{**base, **CASES[name]})
        rows.append(
            f"| {name} | {r['seconds']:.2f} | {r['tok_s']:.0f} | {r['steps']} | "
            f"{1e3 * r['gpu_idle_s'] / max(r['steps'], 1):.3f} | {100 * r['gpu_idle_s'] / r['seconds']:.1f} | "
            f"{r['plan_imbalance_mean']:.3f} | {r['graph_steps']} | {r['wasted_tokens']} |"
        )
        print(rows[-1], flush=True)
    ratio = ""
    if "all on" in results and "all off" in results:
        ratio = f"all on / all off: {results['all on']['tok_s'] / results['all off']['tok_s']:.2f}x output tok/s"
    table = "\n".join([
        f"GPU: {torch.cuda.get_device_name()}; {args.model} random bf16 weights; {args.num} requests, "
        f"{args.num_long} of them {args.long_min}-{args.long_max} prompt tokens, the rest "
        f"{args.short_min}-{args.short_max}; outputs {args.output_min}-{args.output_max}; "
        f"temperature 0.6, ignore_eos; {sum(map(len, prompts))} prompt tokens in all",
        "",
        "| case | time s | output tok/s | steps | GPU idle ms/step | GPU idle % | plan imbalance (mean) | graph steps | wasted tokens |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        ratio,
    ])
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
