"""Batch-1 decode on the GPU, kernel by kernel: tok/s against the memory roofline and, from
torch.profiler over graph replays, each kernel's time per step, for each engine variant
(``TESSEL_*`` switches set per variant, read when the decode graphs are captured).

    PYTHONPATH=. python3 benchmarks/decode_profile.py [--models Llama-3.2-1B Llama-3.1-8B]
"""

from __future__ import annotations

import argparse
import gc
import os
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.decode_roofline import (
    NEW_TOKENS,
    PROMPT_LEN,
    copy_bandwidth,
    step_bytes,
    use_gpu_dummy_weights,
)
from benchmarks.report import emit

_DEFAULTS = {"TESSEL_FUSED_SAMPLING": "1", "TESSEL_PDL": "1", "TESSEL_GEMV": "0", "TESSEL_PREFETCH_LINES": "8",
             "TESSEL_GEMV_MAX_MB": "1e9"}
VARIANTS = {  # every switch set in each, since os.environ carries over between variants
    "torch sampling": {**_DEFAULTS, "TESSEL_FUSED_SAMPLING": "0"},
    "fused sampling": _DEFAULTS,
    "no PDL": {**_DEFAULTS, "TESSEL_PDL": "0"},
    "triton GEMV": {**_DEFAULTS, "TESSEL_GEMV": "1"},  # kernels/gemv.py, opt-in
    "triton GEMV <= 50 MB": {**_DEFAULTS, "TESSEL_GEMV": "1", "TESSEL_GEMV_MAX_MB": "50"},
    "triton GEMV no prefetch": {**_DEFAULTS, "TESSEL_GEMV": "1", "TESSEL_PREFETCH_LINES": "0"},
}
PROFILED_TOKENS = 48


def run_variant(model: str, env: dict[str, str]) -> tuple[float, dict[str, tuple[float, float]], float]:
    """(decode tok/s, kernel -> (calls per step, us per step), kernel us per step in all)."""
    from tessel.engine import LLM, SamplingParams

    os.environ.update(env)
    llm = LLM(model, load_format="dummy", max_model_len=PROMPT_LEN + NEW_TOKENS + 64, max_num_seqs=8,
              cuda_graph_batch_sizes=[1, 2, 4, 8])
    prompt = list(range(10, 10 + PROMPT_LEN))
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))[0]
    times = out.metrics.token_times  # type: ignore[union-attr]
    rate = (len(times) - 1) / (times[-1] - times[0])
    params = SamplingParams(temperature=0.0, max_tokens=PROFILED_TOKENS, ignore_eos=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate([prompt], params)
        torch.cuda.synchronize()
    steps = PROFILED_TOKENS - 1  # the first token comes from the prefill step
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in prof.key_averages():
        if e.self_device_time_total > 0:
            per[e.key][0] += e.count / steps
            per[e.key][1] += e.self_device_time_total / steps
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    kernels = {k: (v[0], v[1]) for k, v in per.items()}
    return rate, kernels, sum(v[1] for v in kernels.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["Llama-3.2-1B", "Llama-3.1-8B"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    use_gpu_dummy_weights()
    from tessel.config import load_preset

    bw = copy_bandwidth()
    summary = [f"GPU: {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e9:.0f} GB/s; batch 1, prompt {PROMPT_LEN}, "
               f"{NEW_TOKENS} new tokens, bf16 random weights; kernel times from torch.profiler over "
               f"{PROFILED_TOKENS - 1} decode steps (the prefill step's kernels included, spread over them)", "",
               "| model | variant | tok/s | % roofline | step us (1/rate) | kernel us/step | kernels/step |",
               "|---|---|---|---|---|---|---|"]
    detail: list[str] = []
    for model in args.models:
        roof = bw / step_bytes(load_preset(model), PROMPT_LEN + NEW_TOKENS / 2)
        for variant in args.variants:
            rate, kernels, busy = run_variant(model, VARIANTS[variant])
            count = sum(c for c, _ in kernels.values())
            summary.append(f"| {model} | {variant} | {rate:.0f} | {100 * rate / roof:.0f}% | {1e6 / rate:.0f} | "
                           f"{busy:.0f} | {count:.0f} |")
            print(summary[-1], flush=True)
            detail += ["", f"{model}, {variant}: top kernels per decode step", "",
                       "| kernel | calls/step | us/step | us/call |", "|---|---|---|---|"]
            for name, (calls, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[: args.top]:
                detail.append(f"| {name[:80]} | {calls:.1f} | {us:.1f} | {us / max(calls, 1e-9):.2f} |")
    from tessel.kernels.attention.decode import _decode_kernel

    picks = {str(k[:3]): str(v) for k, v in _decode_kernel.cache.items()}  # type: ignore[attr-defined]
    summary += ["", f"decode attention autotune picks (HEAD_DIM, GROUP_PAD, PAGE): {picks}"]
    emit(detail + [""] + summary, args.out)


if __name__ == "__main__":
    main()
