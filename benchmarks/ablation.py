"""Ablation on a mixed long-context workload: everything on, then one switch off at a time
(balanced -> static split, overlap off, CUDA graphs off), then all off; one process, same data.

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


def mixed(num: int, long_every: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Mostly short prompts (128-1024) with every ``long_every``-th one long (8k-15k tokens)."""
    rng = Random(seed)
    lens = [rng.randint(8192, 15000) if i % long_every == 0 else rng.randint(128, 1024) for i in range(num)]
    return [[rng.randint(0, 10000) for _ in range(n)] for n in lens], [rng.randint(64, 256) for _ in lens]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Llama-3.2-1B")
    ap.add_argument("--num", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    use_gpu_dummy_weights()
    prompts, outputs = mixed(args.num, 8)
    base = dict(max_model_len=16384, max_num_seqs=64, max_num_batched_tokens=8192,
                cuda_graph_batch_sizes=[1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64])
    results = {}
    rows = []
    for name, switches in CASES.items():
        r = results[name] = run(args.model, prompts, outputs, **{**base, **switches})
        rows.append(
            f"| {name} | {r['seconds']:.2f} | {r['tok_s']:.0f} | {r['steps']} | "
            f"{1e3 * r['gpu_idle_s'] / max(r['steps'], 1):.3f} | {r['plan_imbalance_mean']:.3f} | {r['graph_steps']} | "
            f"{r['wasted_tokens']} |"
        )
        print(rows[-1], flush=True)
    table = "\n".join([
        f"GPU: {torch.cuda.get_device_name()}; {args.model} random bf16 weights; {args.num} requests, every 8th "
        f"prompt 8k-15k tokens, the rest 128-1024; outputs 64-256; temperature 0.6, ignore_eos",
        "",
        "| case | time s | output tok/s | steps | GPU idle ms/step | plan imbalance (mean) | graph steps | wasted tokens |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
