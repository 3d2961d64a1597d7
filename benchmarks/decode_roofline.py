"""Batch-1 decode tok/s against the memory roofline, beside transformers on the same GPU.

Roofline: every decode step reads all weights once (embedding row excepted) plus the KV cache
of the context so far; at the copy bandwidth measured in this run, that gives the fastest
possible step. Random bf16 weights of the presets' real shapes (``load_format='dummy'``).

    PYTHONPATH=. python3 benchmarks/decode_roofline.py --models Llama-3.2-1B Llama-3.1-8B --out r.md
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

PROMPT_LEN, NEW_TOKENS = 512, 256


def gpu_random_weights(hf_config: dict[str, Any], seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The dummy loader's weights, drawn on the GPU in bf16 (the CPU draw of 8B floats is slow)."""
    from tessel.engine.loader.dummy import INIT_STD
    from tessel.engine.loader.names import expected_shapes, is_norm

    gen = torch.Generator(device="cuda").manual_seed(seed)
    for name, shape in expected_shapes(hf_config).items():
        if is_norm(name):
            yield name, torch.ones(shape, device="cuda", dtype=torch.bfloat16)
        else:
            w = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
            yield name, w.normal_(0.0, INIT_STD, generator=gen)


def use_gpu_dummy_weights() -> None:
    import tessel.engine.loader.dummy as dummy

    dummy.random_weights = gpu_random_weights  # type: ignore[assignment]


def copy_bandwidth(gib: float = 2.0) -> float:
    """Device-to-device copy, bytes read + written per second (median of 20)."""
    n = int(gib * 2**30) // 2
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    times = []
    for _ in range(25):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 2 / sorted(times[5:])[len(times[5:]) // 2]


def free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def step_bytes(hf: dict[str, Any], context: float) -> float:
    """Weight bytes read per decode step (bf16; a MoE's active experts only) plus KV bytes at ``context`` tokens."""
    from tessel.engine.loader.names import expected_shapes

    shapes = expected_shapes(hf)
    # A batch-1 MoE step reads only its top-k experts: count each expert at k / E (active weights).
    experts = hf.get("num_experts") or hf.get("num_local_experts") or 0
    share = hf["num_experts_per_tok"] / experts if experts else 1.0
    total = sum(torch.Size(s).numel() * (share if ".experts." in n else 1.0) for n, s in shapes.items())
    if not hf.get("tie_word_embeddings", False):  # the embedding is gathered, not streamed
        total -= torch.Size(shapes["model.embed_tokens.weight"]).numel()
    hd = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    kv_per_token = 2 * hf["num_hidden_layers"] * hf["num_key_value_heads"] * hd * 2
    return 2 * total + kv_per_token * context


def engine_decode_rate(model: str, **kw: Any) -> tuple[float, dict[str, Any]]:
    """Decode tok/s of one request (first token to last), after a warm-up request."""
    from tessel.engine import LLM, SamplingParams

    llm = LLM(model, load_format="dummy", max_model_len=PROMPT_LEN + NEW_TOKENS + 64, max_num_seqs=8, **kw)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    prompt = list(range(10, 10 + PROMPT_LEN))
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    out = llm.generate([prompt], params)[0]
    times = out.metrics.token_times  # type: ignore[union-attr]
    rate = (len(times) - 1) / (times[-1] - times[0])
    stats = llm.core.stats()
    info = {
        "last_step_stage_ms": stats.last_step_stage_ms,
        "gpu_idle_ms_per_step": 1e3 * stats.gpu_idle_seconds_total / max(stats.steps_total, 1),
        "graph_steps": stats.cuda_graph_steps_total,
    }
    del llm
    free()
    return rate, info


def hf_decode_rate(model: str) -> float:
    """transformers, eager, static cache: (t(1 + N new) - t(1 new)) / N."""
    import transformers

    from tessel.config import load_preset

    cfg = load_preset(model)
    config = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("cuda"):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ids = torch.arange(10, 10 + PROMPT_LEN, device="cuda")[None]

    def run(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, cache_implementation="static",
                        pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    run(8)
    return (NEW_TOKENS - 1) / (run(NEW_TOKENS) - run(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["Llama-3.2-1B", "Llama-3.1-8B"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--graphs-only", action="store_true", help="skip the eager engine run")
    args = ap.parse_args()
    use_gpu_dummy_weights()
    from tessel.config import load_preset

    bw = copy_bandwidth()
    rows, raw = [], {}
    for model in args.models:
        hf_cfg = load_preset(model)
        roof = bw / step_bytes(hf_cfg, PROMPT_LEN + NEW_TOKENS / 2)
        try:
            hf_rate = float("nan") if args.skip_hf else hf_decode_rate(model)
            free()
        except Exception as e:  # report the engine's numbers even if transformers cannot run
            print(f"transformers failed on {model}: {e!r}", flush=True)
            hf_rate = float("nan")
            free()
        graphs, info_g = engine_decode_rate(model, cuda_graph_batch_sizes=[1, 2, 4, 8])
        print(f"{model}: graphs {graphs:.0f} tok/s, roofline {roof:.0f}", flush=True)
        eager, info_e = (float("nan"), {}) if args.graphs_only else engine_decode_rate(model, enforce_eager=True)
        print(f"{model}: eager {eager:.0f} tok/s", flush=True)
        raw[model] = {"roofline": roof, "graphs": graphs, "eager": eager, "hf": hf_rate, "info": info_g, "info_eager": info_e}
        rows.append(
            f"| {model} | {step_bytes(hf_cfg, PROMPT_LEN + NEW_TOKENS / 2) / 1e9:.2f} | {roof:.0f} | "
            f"{graphs:.0f} ({100 * graphs / roof:.0f}%) | {eager:.0f} ({100 * eager / roof:.0f}%) | "
            f"{hf_rate:.0f} ({100 * hf_rate / roof:.0f}%) | {info_g['gpu_idle_ms_per_step']:.3f} |"
        )
        print(rows[-1], flush=True)
    table = "\n".join([
        f"GPU: {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e9:.0f} GB/s (read + write, measured here); "
        f"batch 1, prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens, bf16, random weights",
        "",
        "| model | GB/step | roofline tok/s | Tessel graphs+overlap | Tessel eager+overlap | transformers (static cache, eager) | GPU idle ms/step |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ])
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_bandwidth": bw, **raw}, indent=1, default=str))


if __name__ == "__main__":
    main()
