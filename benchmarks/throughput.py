"""Offline throughput on nano-vllm's benchmark: 256 sequences, input and output lengths uniform in
[100, 1024], ignore_eos, random token ids; Qwen3-0.6B shapes with random bf16 weights.
Fixed lengths instead (issue 5's second case: Llama-3.1-8B, 1,000 requests of 1,024 in / 256 out):

    PYTHONPATH=. python3 benchmarks/throughput.py --out throughput.md
    PYTHONPATH=. python3 benchmarks/throughput.py --model Llama-3.1-8B --num 1000 --input-len 1024 --output-len 256
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from random import Random
from typing import Any

import torch

from benchmarks.decode_roofline import free, use_gpu_dummy_weights


def workload(num: int, lo: int, hi: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """nano-vllm's bench.py: prompt ids uniform in [0, 10000], lengths uniform in [lo, hi]."""
    rng = Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(lo, hi))] for _ in range(num)]
    outputs = [rng.randint(lo, hi) for _ in range(num)]
    return prompts, outputs


def run(model: str, prompts: list[list[int]], outputs: list[int], **kw: Any) -> dict[str, Any]:
    from tessel.engine import LLM, SamplingParams

    llm = LLM(model, load_format="dummy", **kw)
    llm.generate([[1, 2, 3]] * 4, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))  # warm-up
    params = [SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True) for n in outputs]
    torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    assert produced == sum(outputs), (produced, sum(outputs))
    s = llm.core.stats()
    result = {
        "seconds": elapsed, "output_tokens": produced, "tok_s": produced / elapsed,
        "total_tok_s": (produced + sum(map(len, prompts))) / elapsed,
        "steps": s.steps_total, "stage_seconds": s.stage_seconds_total,
        "gpu_idle_s": s.gpu_idle_seconds_total, "graph_steps": s.cuda_graph_steps_total,
        "preemptions": s.preemptions_total, "plan_imbalance_mean": s.decode_plan_imbalance_mean,
        "wasted_tokens": s.wasted_tokens_total,
    }
    del llm
    free()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen3-0.6B")
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=None, help="every prompt this long (default: nano-vllm's)")
    ap.add_argument("--output-len", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    use_gpu_dummy_weights()
    prompts, outputs = workload(args.num, 100, 1024)
    lengths = "in/out uniform [100, 1024]"
    if args.input_len is not None or args.output_len is not None:
        fixed_in, fixed_out = args.input_len or 1024, args.output_len or 256
        prompts = [(p * (fixed_in // len(p) + 1))[:fixed_in] for p in prompts]
        outputs = [fixed_out] * args.num
        lengths = f"{fixed_in} in / {fixed_out} out"
    kw = dict(max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=16384)
    r = run(args.model, prompts, outputs, **kw)
    stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stage_seconds"].items())
    table = "\n".join([
        f"GPU: {torch.cuda.get_device_name()}; {args.model} random bf16 weights; {args.num} seqs, {lengths}, "
        f"ignore_eos, temperature 0.6; {kw}",
        "",
        "| engine | output tokens | time s | output tok/s | (prompt+output) tok/s | steps | GPU idle s | graph steps |",
        "|---|---|---|---|---|---|---|---|",
        f"| Tessel (graphs, overlap, balanced) | {r['output_tokens']} | {r['seconds']:.2f} | {r['tok_s']:.0f} | "
        f"{r['total_tok_s']:.0f} | {r['steps']} | {r['gpu_idle_s']:.2f} | {r['graph_steps']} |",
        "",
        f"stage seconds (summed; 1/5 host, 2-4 device): {stages}",
    ])
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1, default=str))


if __name__ == "__main__":
    main()
