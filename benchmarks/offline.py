"""Offline throughput on the CPU: Tessel's LLM against transformers' batched generate.

Same weights (the default model's GGUF, dequantized to fp32), same prompts, greedy,
ignore_eos so every request makes exactly ``--output-len`` tokens. Each side runs in its own
subprocess so its peak RSS is its own.

    python benchmarks/offline.py [--num-prompts 64] [--output-len 128] [--hf-batch 64]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards", "quietly", "judge", "boxing", "matches", "in", "the", "old", "town", "square", "near", "rivers", "mountains", "and", "forests", "under", "bright", "summer", "skies"]


SIDES = ("tessel", "transformers", "transformers+malloc")


def make_prompts(n: int, min_len: int, max_len: int, seed: int) -> list[str]:
    """Prompts of mixed lengths, in words (about one token each for this vocabulary)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_len, max_len))) for _ in range(n)]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_tessel(prompts: list[str], output_len: int) -> dict[str, float]:
    from tessel.engine import LLM, SamplingParams

    llm = LLM()
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"seconds": elapsed, "output_tokens": tokens, "peak_rss_mb": peak_rss_mb()}


def run_transformers(prompts: list[str], output_len: int, batch: int, tuned_malloc: bool = False) -> dict[str, float]:
    import torch

    if tuned_malloc:  # the allocator settings the CPU engine applies, to show what they alone give
        from tessel.engine.runner.host_allocator import keep_step_buffers_in_heap

        keep_step_buffers_in_heap()
    from transformers import LlamaConfig, LlamaForCausalLM

    from tessel.config import ModelConfig
    from tessel.engine.loader import load_checkpoint

    ckpt = load_checkpoint(ModelConfig())
    model = LlamaForCausalLM(LlamaConfig(**ckpt.hf_config)).eval()
    model.load_state_dict(dict(ckpt.weights()), strict=False)
    model.tie_weights()
    tok = ckpt.tokenizer
    assert tok is not None
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tokens = 0
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            enc = tok(prompts[i : i + batch], return_tensors="pt", padding=True)
            out = model.generate(
                **enc, max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
            tokens += (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "output_tokens": tokens, "peak_rss_mb": peak_rss_mb()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    prompts = make_prompts(args.num_prompts, args.min_len, args.max_len, args.seed)
    if args.side == "tessel":
        print(json.dumps(run_tessel(prompts, args.output_len)))
        return
    if args.side in ("transformers", "transformers+malloc"):
        tuned = args.side == "transformers+malloc"
        print(json.dumps(run_transformers(prompts, args.output_len, args.hf_batch, tuned)))
        return
    results = {}
    for side in SIDES:
        cmd = [sys.executable, __file__, "--side", side] + sys.argv[1:]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[side] = json.loads(out.strip().splitlines()[-1])
    print(f"{args.num_prompts} prompts of {args.min_len}-{args.max_len} words, {args.output_len} output tokens, greedy")
    print("| engine | output tok/s | seconds | peak RSS (MB) |")
    print("|---|---|---|---|")
    for side, r in results.items():
        print(f"| {side} | {r['output_tokens'] / r['seconds']:.1f} | {r['seconds']:.1f} | {r['peak_rss_mb']:.0f} |")
    ratio = (results["tessel"]["output_tokens"] / results["tessel"]["seconds"]) / (
        results["transformers"]["output_tokens"] / results["transformers"]["seconds"]
    )
    print(f"ratio tessel / transformers: {ratio:.2f}x")
    tuned = (results["tessel"]["output_tokens"] / results["tessel"]["seconds"]) / (
        results["transformers+malloc"]["output_tokens"] / results["transformers+malloc"]["seconds"]
    )
    print(f"ratio tessel / (transformers with Tessel's malloc settings): {tuned:.2f}x")


if __name__ == "__main__":
    main()
