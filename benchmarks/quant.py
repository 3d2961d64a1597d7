"""W8A8 on the GPU, in one run: correctness checks, GEMM TFLOP/s on Llama-3.1-8B layer shapes,
then the engine end to end (random weights of the Llama-3.1-8B preset) in bf16, int8 and fp8.

GEMMs, M = 1 ... 4096 tokens: ours int8 and fp8 (dequant fused, bf16 out) against torch's bf16
matmul, ``torch._int_mm`` (int8 -> int32, no scaling) and ``torch._scaled_mm`` (fp8, row-wise
scales, bf16 out). Inputs are pre-quantized; "int8+q" adds our per-token quantization kernel.
Engine: decode tok/s at batch 64 and 256 (prompt 128, 128 new tokens, measured once every
request has its first token), batch-1 ms per output token, weight GB and KV blocks.
Every variant is wrapped, so one failure leaves the rest of the numbers; a time budget skips
what would run past it.

    PYTHONPATH=. python3 benchmarks/quant.py [--out quant.md] [--json quant.json] [--budget-s 330]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from random import Random
from typing import Any

import torch
import torch.nn.functional as F
import triton

from benchmarks.decode_roofline import free, use_gpu_dummy_weights
from benchmarks.step_trace import decode_breakdown, host_phases, profile_decode, step_records
from tessel.kernels.quant import act_quant, gemm, gemm_configs
from tessel.kernels.quant import reference as ref
from tessel.kernels.quant.types import FP8_DTYPE

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
MS = (1, 16, 64, 256, 1024, 4096)
VARIANTS = ("torch bf16", "ours int8", "ours int8+q", "torch _int_mm", "ours fp8", "torch _scaled_mm")
MODEL = "Llama-3.1-8B"
GRAPHS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
PROMPT_LEN, NEW_TOKENS = 128, 128
BATCHES = (64, 256)
PROFILE_BATCH = 256  # kernel times of a decode step at this batch (0: none)
ENGINE_OVERRIDES: dict[str, Any] = {}  # e.g. a CPU dry run of this script's logic


def bench_ms(fn: Callable[[], Any]) -> float:
    """Median ms over device events, L2 flushed between runs (triton's do_bench)."""
    fn()
    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def operands(m: int, n: int, k: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n + k)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    xi, wi = ref.quantize_rows(x, torch.int8), ref.quantize_rows(w, torch.int8)
    xf, wf = ref.quantize_rows(x, FP8_DTYPE), ref.quantize_rows(w, FP8_DTYPE)
    return dict(x=x, w=w, xi=xi.data, xis=xi.scale, wi=wi.data, wis=wi.scale,
                xf=xf.data, xfs=xf.scale, wf=wf.data, wfs=wf.scale)


def variant_fns(o: dict[str, torch.Tensor]) -> dict[str, Callable[[], Any]]:
    bf16 = torch.bfloat16
    return {
        "torch bf16": lambda: F.linear(o["x"], o["w"]),
        "ours int8": lambda: gemm.scaled_mm(o["xi"], o["xis"], o["wi"], o["wis"], None, bf16),
        "ours int8+q": lambda: (lambda q: gemm.scaled_mm(q.data, q.scale, o["wi"], o["wis"], None, bf16))(
            act_quant.quantize_rows(o["x"], torch.int8)),
        "torch _int_mm": lambda: torch._int_mm(o["xi"], o["wi"].t()),
        "ours fp8": lambda: gemm.scaled_mm(o["xf"], o["xfs"], o["wf"], o["wfs"], None, bf16),
        "torch _scaled_mm": lambda: torch._scaled_mm(o["xf"], o["wf"].t(), scale_a=o["xfs"],
                                                     scale_b=o["wfs"].reshape(1, -1), out_dtype=bf16),
    }


def check_shape(name: str, n: int, k: int) -> dict[str, Any]:
    """Ours (autotuned, bf16 out, as timed) against the references at M = 1 and 100 (ragged):
    outputs within bf16 rounding of the reference's; the int32 sums (one untuned config: the
    tuned ones are checked by tests/kernels) bit-exact against torch._int_mm; and how far W8A8
    lands from the unquantized fp32 product."""
    row: dict[str, Any] = {"shape": name}
    bf16 = torch.bfloat16
    for m in (1, 100):
        o = operands(m, n, k)
        for label, a, s, w, ws in (("int8", "xi", "xis", "wi", "wis"), ("fp8", "xf", "xfs", "wf", "wfs")):
            got = gemm.scaled_mm(o[a], o[s], o[w], o[ws], None, bf16).float()
            want = ref.scaled_mm(o[a], o[s], o[w], o[ws], None, torch.float32)
            row[f"{label} rel err M={m}"] = ((got - want).abs().max() / want.abs().max()).item()
        if m == 100:
            raw = gemm.int8_mm(o["xi"], o["wi"], config=gemm_configs.default_config())
            row["int32 exact vs _int_mm"] = bool(torch.equal(raw, torch._int_mm(o["xi"], o["wi"].t())))
            exact = o["x"].float() @ o["w"].float().T
            q = act_quant.quantize_rows(o["x"], torch.int8)
            ours = gemm.scaled_mm(q.data, q.scale, o["wi"], o["wis"], None, bf16).float()
            row["int8 W8A8 rel err vs fp32 matmul"] = ((ours - exact).abs().max() / exact.abs().max()).item()
    ok = row["int32 exact vs _int_mm"] and all(v < 1e-2 for key, v in row.items() if "rel err M" in key)
    row["ok"] = ok
    return row


def gemm_rows() -> list[dict[str, Any]]:
    rows = []
    for name, (n, k) in SHAPES.items():
        for m in MS:
            row: dict[str, Any] = {"shape": name, "M": m, "N": n, "K": k, "notes": []}
            try:
                fns = variant_fns(operands(m, n, k))
            except Exception as e:
                row["notes"].append(f"operands: {e!r}"[:80])
                rows.append(row)
                continue
            for label, fn in fns.items():
                try:
                    ms = bench_ms(fn)
                    row[label] = 2 * m * n * k / (ms * 1e-3) / 1e12
                    row[label + " us"] = ms * 1e3
                except Exception as e:  # e.g. _int_mm refuses M <= 16
                    row[label] = float("nan")
                    row["notes"].append(f"{label}: {str(e).splitlines()[0][:60]}")
            print(_gemm_line(row), flush=True)
            rows.append(row)
            del fns
            torch.cuda.empty_cache()
    return rows


def _gemm_line(r: dict[str, Any]) -> str:
    cells = [f"{r.get(v, float('nan')):.1f}" for v in VARIANTS]
    speed = [r.get(v, float("nan")) / r.get("torch bf16", float("nan")) for v in ("ours int8", "ours fp8")]
    return (f"| {r['shape']} | {r['M']} | " + " | ".join(cells) + f" | {speed[0]:.2f} | {speed[1]:.2f} | "
            f"{r.get('ours int8 us', float('nan')):.1f} | {'; '.join(r['notes'])} |")


def decode_rate(llm: Any, batch: int, seed: int) -> float:
    """Output tok/s once every request has its first token (all are decoding together)."""
    from tessel.engine import SamplingParams

    rng = Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(PROMPT_LEN)] for _ in range(batch)]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    times = [o.metrics.token_times for o in outs]
    t0 = max(t[0] for t in times)
    tokens = sum(sum(1 for x in t if x > t0) for t in times)
    return tokens / (max(t[-1] for t in times) - t0)


def _head_quant_bytes(model: Any) -> int:
    """A W8A8 LM head (quantize_lm_head) lives outside the parameters."""
    q = getattr(model.head, "head_quant", None)
    return 0 if q is None else q.data.numel() * q.data.element_size() + q.scale.numel() * 4


@contextmanager
def launch_switches(extras: list[str]) -> Iterator[None]:
    """"+nopdl": programmatic dependent launch off (TESSEL_PDL=0); "+noprefetch": the W8A8 GEMM's
    L2 prefetch of its weight off (TESSEL_PREFETCH_LINES=0); "+gemmpdlall": the GEMM under PDL at
    every M (gemm.PDL_MAX_M lifted); "+f16dots" the fp8 KV cache's decode dots in fp16 (TESSEL_FP8_F16=1);
    "+vbytes" its V tile read byte by byte as before (TESSEL_FP8_V_WORDS=0). For one engine case;
    restored after it."""
    switches = {"nopdl": ("TESSEL_PDL", "0"), "noprefetch": ("TESSEL_PREFETCH_LINES", "0"),
                "gemmpdlall": ("TESSEL_GEMM_PDL_MAX_M", "1000000"), "f16dots": ("TESSEL_FP8_F16", "1"),
                "vbytes": ("TESSEL_FP8_V_WORDS", "0")}
    saved = {var: os.environ.get(var) for var, _ in switches.values()}
    for extra in extras:
        if extra in switches:
            os.environ[switches[extra][0]] = switches[extra][1]
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def engine_case(variant: str) -> dict[str, Any]:
    """``variant``: bf16, int8 or fp8, with "+rotation" (quant_rotation=residual_and_down) and/or
    "+head" (quantize_lm_head) appended to a quantized one, e.g. int8+head; "+fp8kv" for an E4M3
    KV cache (kv_cache_dtype=fp8, any variant); "+nosplit" / "+static" for decode attention
    without split-KV or split FlashDecoding's way (decode_split); "+nopdl" and "+noprefetch" for
    the launch A/B (launch_switches); "+tileN.W.S.R.V" pins decode attention's tile (BLOCK_N,
    warps, stages, maxnreg or 0) and its plan's waves (decode_tile)."""
    quantization, *extras = variant.split("+")
    with launch_switches(extras), decode_tile(extras):
        return _engine_case(variant, quantization, extras)


@contextmanager
def decode_tile(extras: list[str]) -> Iterator[None]:
    """"+tile32.4.6.96.6": decode attention runs that one tile config (no autotuning) on a plan
    of 6 waves (``benchmarks/decode_occupancy.py`` writes its best as such a string)."""
    spec = next((e[4:] for e in extras if e.startswith("tile")), None)
    if spec is None:
        yield
        return
    from tessel.engine import shard_setup
    from tessel.kernels.attention import decode as decode_mod

    bn, warps, stages, maxnreg, waves = (int(v) for v in spec.split("."))
    kernel, plan_config = decode_mod._decode_kernel, shard_setup.DecodeConfig
    saved = kernel.configs  # type: ignore[attr-defined]
    kernel.configs = [triton.Config({"BLOCK_N": bn}, num_warps=warps, num_stages=stages,  # type: ignore[attr-defined]
                                    maxnreg=maxnreg or None)]
    kernel.cache = {}  # type: ignore[attr-defined]
    shard_setup.DecodeConfig = lambda **kw: plan_config(**kw, waves=waves)  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        kernel.configs, kernel.cache = saved, {}  # type: ignore[attr-defined]
        shard_setup.DecodeConfig = plan_config  # type: ignore[misc]


def _engine_case(variant: str, quantization: str, extras: list[str]) -> dict[str, Any]:
    from tessel.engine import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(MODEL, load_format="dummy", quantization=None if quantization == "bf16" else quantization,
              quant_rotation="residual_and_down" if "rotation" in extras else None,
              quantize_lm_head="head" in extras, kv_cache_dtype="fp8" if "fp8kv" in extras else "auto",
              max_model_len=max(1024, PROMPT_LEN + NEW_TOKENS), max_num_seqs=256,
              max_num_batched_tokens=8192, cuda_graph_batch_sizes=GRAPHS,
              decode_split="none" if "nosplit" in extras else "static" if "static" in extras else "balanced",
              **ENGINE_OVERRIDES)
    model = llm.core.runner.model
    row: dict[str, Any] = {
        "variant": variant,
        "setup_s": time.perf_counter() - start,
        "weight_gb": (sum(p.numel() * p.element_size() for p in model.parameters())
                      + _head_quant_bytes(model)) / 1e9,
        "kv_blocks": llm.core.stats().kv_blocks_total,
    }
    llm.generate([[1, 2, 3]] * 4, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))  # warm-up
    for batch in BATCHES:
        with step_records(llm) as records, host_phases(llm) as host:
            row[f"decode_tok_s_b{batch}"] = decode_rate(llm, batch, seed=batch)
        row[f"steps_b{batch}"] = decode_breakdown(records, batch)
        row[f"host_b{batch}"] = {k: 1e3 * v / max(len(records), 1) for k, v in host.items()}
    if PROFILE_BATCH:
        rng = Random(1)
        prompts = [[rng.randint(0, 10000) for _ in range(PROMPT_LEN)] for _ in range(PROFILE_BATCH)]
        row["kernels"] = profile_decode(llm, prompts, NEW_TOKENS, steps=16)
    one = llm.generate([list(range(10, 10 + PROMPT_LEN))],
                       SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))[0]
    t = one.metrics.token_times  # type: ignore[union-attr]
    row["b1_ms_per_token"] = 1e3 * (t[-1] - t[0]) / (len(t) - 1)
    row["b1_tokens"] = one.outputs[0].token_ids[:24]  # greedy: equal across variants that only move data
    row["graph_steps"] = llm.core.stats().cuda_graph_steps_total
    print(row, flush=True)
    del llm, model
    free()
    return row


def main() -> None:
    global PROFILE_BATCH, PROMPT_LEN
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget-s", type=float, default=330.0, help="skip engine cases that would start past this")
    ap.add_argument("--skip-gemm", action="store_true")
    ap.add_argument("--variants", nargs="+", default=["bf16", "int8", "fp8"],
                    help="engine variants: bf16, int8, fp8, int8+rotation, int8+head, ...")
    ap.add_argument("--profile-batch", type=int, default=256, help="profile a decode step at this batch; 0: none")
    ap.add_argument("--prompt-len", type=int, default=PROMPT_LEN, help="decode cases' prompt tokens")
    args = ap.parse_args()
    PROFILE_BATCH, PROMPT_LEN = args.profile_batch, args.prompt_len
    start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    head = [f"device: {props.name}, {props.multi_processor_count} SMs, capability {props.major}.{props.minor}; "
            f"torch {torch.__version__}, triton {triton.__version__}"]
    checks, rows, engine = [], [], []
    for name, (n, k) in SHAPES.items():
        try:
            checks.append(check_shape(name, n, k))
        except Exception as e:
            traceback.print_exc()
            checks.append({"shape": name, "ok": False, "error": repr(e)[:120]})
        print(checks[-1], flush=True)
    if not args.skip_gemm:
        rows = gemm_rows()
    gemm_s = time.perf_counter() - start
    free()
    use_gpu_dummy_weights()
    per_case = 75.0  # a case takes ~40-70 s (8B load + profile + 9 graphs + runs); don't start one late
    for variant in args.variants:
        if time.perf_counter() - start + per_case > args.budget_s:
            engine.append({"variant": variant, "note": "skipped: time budget"})
            continue
        try:
            engine.append(engine_case(variant))
        except Exception as e:
            traceback.print_exc()
            engine.append({"variant": variant, "note": f"FAILED {e!r}"[:120]})
            free()
    tuned = {str(key): str(cfg) for key, cfg in getattr(gemm._tuned_kernel, "cache", {}).items()}
    report = _report(head, checks, rows, engine, gemm_s, time.perf_counter() - start)
    if args.out:
        Path(args.out).write_text(report + "\n\nAutotuned (key -> config):\n\n```\n" + json.dumps(tuned, indent=1) + "\n```\n")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(head=head, checks=checks, gemm=rows, engine=engine, tuned=tuned),
                                              indent=1, default=str))
    print(report)


def _report(head: list[str], checks: list[dict[str, Any]], rows: list[dict[str, Any]],
            engine: list[dict[str, Any]], gemm_s: float, total_s: float) -> str:
    lines = [*head, f"checks + GEMMs {gemm_s:.0f} s, total {total_s:.0f} s", "", "Correctness (ours vs references):", ""]
    for c in checks:
        lines.append("  " + ", ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items()))
    lines += ["", f"GEMM TFLOP/s, {MODEL} shapes (M tokens x N out x K in), bf16 out:", "",
              "| layer | M | " + " | ".join(VARIANTS) + " | int8/bf16 | fp8/bf16 | ours int8 us | notes |",
              "|" + "---|" * (len(VARIANTS) + 6)]
    lines += [_gemm_line(r) for r in rows if "notes" in r]
    lines += ["", f"Engine, {MODEL} random weights, prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens, graphs {GRAPHS}:", "",
              "| variant | weights GB | KV blocks | " + " | ".join(f"decode tok/s b={b}" for b in BATCHES)
              + " | b=1 ms/token | x bf16 (" + " / ".join(f"b={b}" for b in BATCHES) + ") | note |",
              "|" + "---|" * (6 + len(BATCHES))]
    base = next((e for e in engine if e["variant"].startswith("bf16") and "kv_blocks" in e), {})
    for e in engine:
        if "kv_blocks" not in e:
            lines.append(f"| {e['variant']} |" + " |" * (4 + len(BATCHES)) + f" {e.get('note', '')} |")
            continue
        rates = [e[f"decode_tok_s_b{b}"] for b in BATCHES]
        rel = [r / base.get(f"decode_tok_s_b{b}", float("nan")) for r, b in zip(rates, BATCHES, strict=True)]
        lines.append(f"| {e['variant']} | {e['weight_gb']:.2f} | {e['kv_blocks']} | "
                     + " | ".join(f"{r:.0f}" for r in rates) + f" | {e['b1_ms_per_token']:.2f} | "
                     + " / ".join(f"{r:.2f}" for r in rel) + f" | setup {e['setup_s']:.0f} s |")
    lines += ["", "Median ms per decode step with the whole batch decoding (graph replays): host wall time "
              "between steps, GPU compute and aggregate (events), GPU idle before the step's compute, host "
              "prepare and return:", "",
              "| variant | batch | steps | wall | compute | aggregate | GPU idle | prepare | return |",
              "|---|---|---|---|---|---|---|---|---|"]
    for e in engine:
        for b in BATCHES:
            st = e.get(f"steps_b{b}")
            if st:
                lines.append(f"| {e['variant']} | {b} | {st['steps']:.0f} | {st['wall']:.2f} | {st['compute']:.2f} | "
                             f"{st['aggregate']:.2f} | {st['gpu_idle']:.2f} | {st['prepare']:.2f} | {st['return']:.2f} |")
    lines += ["", "Host ms per step inside the engine loop's parts (mean over each decode run, prefill steps "
              "included; launch holds prepare, finish the wait for the step):", "",
              "| variant | batch | schedule | launch | finish | process | update |", "|---|---|---|---|---|---|---|"]
    for e in engine:
        for b in BATCHES:
            h = e.get(f"host_b{b}")
            if h:
                lines.append(f"| {e['variant']} | {b} | " + " | ".join(f"{h[k]:.2f}" for k in
                             ("schedule", "launch", "finish", "process", "update")) + " |")
    for e in engine:
        if e.get("kernels"):
            lines += ["", f"{e['variant']}: kernels of a b={PROFILE_BATCH} decode step (torch.profiler, 16 steps; "
                      "under PDL a kernel's time includes its wait for the one before):", "",
                      "| kernel | calls/step | us/step |", "|---|---|---|"]
            lines += [f"| {name} | {calls:.1f} | {us:.0f} |" for name, calls, us in e["kernels"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
