"""Offline throughput on nano-vllm's benchmark: 256 sequences, input and output lengths uniform in
[100, 1024], ignore_eos, random token ids; Qwen3-0.6B shapes with random bf16 weights.
Fixed lengths instead (issue 5's second case: Llama-3.1-8B, 1,000 requests of 1,024 in / 256 out):

    PYTHONPATH=. python3 benchmarks/throughput.py --out throughput.md
    PYTHONPATH=. python3 benchmarks/throughput.py --model Llama-3.1-8B --num 1000 --input-len 1024 --output-len 256
The online benchmark's workload offline (what the engine alone does with `serve.py --lengths sharegpt`):

    PYTHONPATH=. python3 benchmarks/throughput.py --model Llama-3.1-8B --num 500 --sharegpt --max-num-batched-tokens 2048
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from random import Random
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.decode_roofline import free, use_gpu_dummy_weights
from benchmarks.serve import sharegpt_like_lengths

if TYPE_CHECKING:
    from tessel.engine import LLM


def workload(num: int, lo: int, hi: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """nano-vllm's bench.py: prompt ids uniform in [0, 10000], lengths uniform in [lo, hi]."""
    rng = Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(lo, hi))] for _ in range(num)]
    outputs = [rng.randint(lo, hi) for _ in range(num)]
    return prompts, outputs


def warm_dummy_llm(model: str, **kw: Any) -> LLM:
    """An engine on ``model``'s shapes with random weights (drawn on the GPU when there is
    one), after a short warm-up generation so the timed work starts compiled."""
    from tessel.engine import LLM, SamplingParams

    if torch.cuda.is_available():
        use_gpu_dummy_weights()
    llm = LLM(model, load_format="dummy", **kw)
    llm.generate([[1, 2, 3]] * 4, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    return llm


def run(model: str, prompts: list[list[int]], outputs: list[int], **kw: Any) -> dict[str, Any]:
    from tessel.engine import SamplingParams

    llm = warm_dummy_llm(model, **kw)
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


def hf_run(model: str, prompts: list[list[int]], outputs: list[int], max_time: float) -> dict[str, Any]:
    """transformers on the same GPU: one left-padded batch, every row run to the longest output
    (what static batching costs); only the tokens each request asked for are counted. Stopped
    after ``max_time`` s, it is credited with the requested tokens of the steps it ran."""
    import transformers

    from tessel.config import load_preset

    cfg = load_preset(model)
    config = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("cuda"):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device="cuda")
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device="cuda")
    new = max(outputs)
    with torch.inference_mode():
        hf.generate(ids[:2, -16:], attention_mask=mask[:2, -16:], max_new_tokens=4, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=True,
                          temperature=0.6, pad_token_id=0, max_time=max_time)
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t
    steps = out.shape[1] - width
    useful = sum(min(n, steps) for n in outputs)
    del hf, out
    free()
    return {"seconds": elapsed, "output_tokens": useful, "tok_s": useful / elapsed, "steps": steps,
            "total_tok_s": (useful + sum(map(len, prompts))) / elapsed,
            "experts_implementation": getattr(config, "_experts_implementation", None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen3-0.6B")
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=None, help="every prompt this long (default: nano-vllm's)")
    ap.add_argument("--output-len", type=int, default=None)
    ap.add_argument("--sharegpt", action="store_true", help="serve.py's synthetic ShareGPT-like lengths")
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--hf-num", type=int, default=0,
                    help="also run transformers, and Tessel again, on the first N of these requests")
    ap.add_argument("--hf-max-time", type=float, default=120.0, help="stop transformers after this many s")
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
    if args.sharegpt:
        pairs = sharegpt_like_lengths(args.num, seed=0)
        prompts = [(p * (n // len(p) + 1))[:n] for p, (n, _) in zip(prompts, pairs, strict=True)]
        outputs = [m for _, m in pairs]
        lengths = "ShareGPT-like lengths (serve.py's)"
    kw = dict(max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=args.max_num_batched_tokens)
    r = run(args.model, prompts, outputs, **kw)
    print(f"Tessel: {r['tok_s']:.0f} output tok/s, {args.num / r['seconds']:.1f} req/s", flush=True)
    subset = []
    if args.hf_num:
        n = args.hf_num
        t = run(args.model, prompts[:n], outputs[:n], **kw)
        print(f"Tessel, first {n}: {t['tok_s']:.0f} output tok/s", flush=True)
        try:
            h = hf_run(args.model, prompts[:n], outputs[:n], args.hf_max_time)
        except Exception as e:  # report the engine's numbers even if transformers cannot run
            print(f"transformers failed: {e!r}", flush=True)
            h = {"seconds": float("nan"), "output_tokens": sum(outputs[:n]), "tok_s": float("nan"), "total_tok_s": float("nan")}
            free()
        r["subset"] = {"n": n, "tessel": t, "transformers": h}
        subset = [
            f"| Tessel, first {n} requests | {t['output_tokens']} | {t['seconds']:.2f} | {t['tok_s']:.0f} | "
            f"{t['total_tok_s']:.0f} | {t['steps']} | {t['gpu_idle_s']:.2f} | {t['graph_steps']} |",
            f"| transformers (one padded batch, bf16, {h.get('steps', '?')} steps), first {n} | {h['output_tokens']} | {h['seconds']:.2f} | "
            f"{h['tok_s']:.0f} | {h['total_tok_s']:.0f} | | | |",
            f"| ratio Tessel / transformers, first {n} | | | {t['tok_s'] / h['tok_s']:.2f}x | | | | |",
        ]
    stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stage_seconds"].items())
    table = "\n".join([
        f"GPU: {torch.cuda.get_device_name()}; {args.model} random bf16 weights; {args.num} seqs, {lengths}, "
        f"ignore_eos, temperature 0.6; {kw}",
        "",
        "| engine | output tokens | time s | output tok/s | (prompt+output) tok/s | steps | GPU idle s | graph steps |",
        "|---|---|---|---|---|---|---|---|",
        f"| Tessel (graphs, overlap, balanced) | {r['output_tokens']} | {r['seconds']:.2f} | {r['tok_s']:.0f} | "
        f"{r['total_tok_s']:.0f} | {r['steps']} | {r['gpu_idle_s']:.2f} | {r['graph_steps']} |",
        *subset,
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
