"""Decode attention over a bf16 KV cache against the same cache in E4M3 (``kv_cache_dtype=fp8``).

Llama-3.1-8B attention shape, the balanced split-KV kernel, CUDA-graph timed (as the engine runs
decode), each case's bf16 and fp8 runs side by side; bandwidth is each cache's bytes read over
time against a device-to-device copy of the same run. The error column is the fp8 output's
largest difference from the bf16 one (random K/V of unit variance).

The kernel autotunes once per dtype and process, on its first call, and its key holds no batch
or length: every case runs the tile picked on the first one. ``--tune-context N`` makes that
first call 256 requests of N tokens, as the engine's start-up tuning does (N = 992 under
max_model_len 1024); the picks are printed last.

``--sweep`` instead pins each tile config in turn, for the bf16 cache and three ways of reading
the fp8 one: as the engine does (V read as 32-bit words, ``kernels/attention/fp8_words.py``), the
same with fp16 dots (``TESSEL_FP8_F16=1``: one conversion instruction per two values instead of
three) and V read byte by byte as before (``TESSEL_FP8_V_WORDS=0``); it prints each case's best
and worst tile per variant.

    PYTHONPATH=. python3 benchmarks/fp8_kv_decode.py [--tune-context 992 | --sweep] [--out fp8_kv_decode.md]
"""

from __future__ import annotations

import argparse
import functools
import os

import numpy as np
import torch
import triton

from benchmarks.attention import HKV, HQ, D, bench_graph, copy_bandwidth, make_decode_batch
from benchmarks.report import emit
from tessel.kernels.attention import decode as decode_mod
from tessel.kernels.attention.decode import DecodeConfig, build_decode_plan, paged_decode

CASES = {
    "engine b=256 x 256": np.full(256, 256),
    "b=64 x 4K": np.full(64, 4096),
    "b=256 lognormal (median 1K, max 64K)": np.clip(
        np.random.default_rng(0).lognormal(np.log(1024), 1.3, 256), 1, 65536).astype(np.int64),
    "b=1 x 128K": np.array([131072]),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--tune-context", type=int, default=0, help="tune on 256 requests of this many tokens first")
    ap.add_argument("--sweep", action="store_true", help="time every tile config of each case, per cache variant")
    args = ap.parse_args()
    if args.sweep:
        return sweep(args.out)
    copy_bw = copy_bandwidth()
    if args.tune_context:
        tune_first(np.full(256, args.tune_context))
    lines = [f"device: {torch.cuda.get_device_name()}; copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)", "",
             "| case | KV MB bf16 | bf16 ms | fp8 ms | bf16 / fp8 | bf16 % copy bw | fp8 % copy bw | max abs err |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, lens in CASES.items():
        batch = make_decode_batch(lens)
        plan = build_decode_plan(lens, HQ, HKV, D, torch.device("cuda"), DecodeConfig())
        caches = {"bf16": (batch.k_cache, batch.v_cache),
                  "fp8": (batch.k_cache.to(torch.float8_e4m3fn), batch.v_cache.to(torch.float8_e4m3fn))}
        ms, outs = {}, {}
        for label, (k, v) in caches.items():
            out = torch.empty_like(batch.q)
            fn = functools.partial(paged_decode, batch.q, k, v, batch.tables, plan, D**-0.5, out)
            fn()
            outs[label] = out.float()
            ms[label] = bench_graph(fn)
        kv_bytes = int(lens.sum()) * HKV * D * 2  # K and V, elements
        pct = {label: 100 * kv_bytes * size / (ms[label] * 1e-3) / copy_bw for label, size in (("bf16", 2), ("fp8", 1))}
        err = (outs["fp8"] - outs["bf16"]).abs().max().item()
        lines.append(f"| {name} | {kv_bytes * 2 / 1e6:.0f} | {ms['bf16']:.3f} | {ms['fp8']:.3f} | "
                     f"{ms['bf16'] / ms['fp8']:.2f}x | {pct['bf16']:.0f} | {pct['fp8']:.0f} | {err:.3f} |")
        print(lines[-1], flush=True)
        del batch, caches, outs
        torch.cuda.empty_cache()
    lines += ["", f"tuned first on: {'256 x ' + str(args.tune_context) if args.tune_context else 'the first case'}"]
    lines += [f"- {key}: {cfg}" for key, cfg in decode_mod._decode_kernel.cache.items()]  # type: ignore[attr-defined]
    emit(lines, args.out)


def tune_first(lens: np.ndarray) -> None:
    """One call per cache dtype on ``lens``: the autotuner's pick for the whole run."""
    batch = make_decode_batch(lens)
    plan = build_decode_plan(lens, HQ, HKV, D, torch.device("cuda"), DecodeConfig())
    for k, v in ((batch.k_cache, batch.v_cache),
                 (batch.k_cache.to(torch.float8_e4m3fn), batch.v_cache.to(torch.float8_e4m3fn))):
        paged_decode(batch.q, k, v, batch.tables, plan, D**-0.5)
    torch.cuda.synchronize()


SWITCHES = ("TESSEL_FP8_F16", "TESSEL_FP8_V_WORDS")
# label: (cache dtype, the switches it turns on)
SWEEP_VARIANTS = {"bf16": (torch.bfloat16, ()), "fp8": (torch.float8_e4m3fn, ("TESSEL_FP8_V_WORDS",)),
                  "fp8 f16 dots": (torch.float8_e4m3fn, ("TESSEL_FP8_V_WORDS", "TESSEL_FP8_F16")),
                  "fp8 V bytes": (torch.float8_e4m3fn, ())}


def sweep(out: str | None) -> None:
    """Each case x cache variant x tile config, pinned one at a time: the best tile per case and
    variant, against the autotuner's single pick for the whole run."""
    kernel = decode_mod._decode_kernel
    configs = list(kernel.configs)  # type: ignore[attr-defined]
    lines = ["| case | variant | best ms | best config (BLOCK_N/warps/stages) | worst ms | max err vs bf16 | per config |",
             "|---|---|---:|---|---:|---:|---|"]
    for name, lens in CASES.items():
        batch = make_decode_batch(lens)
        plan = build_decode_plan(lens, HQ, HKV, D, torch.device("cuda"), DecodeConfig())
        ref = None
        for label, (dtype, on) in SWEEP_VARIANTS.items():
            os.environ.update({switch: "1" if switch in on else "0" for switch in SWITCHES})
            k, v = batch.k_cache.to(dtype), batch.v_cache.to(dtype)
            out_t = torch.empty_like(batch.q)
            fn = functools.partial(paged_decode, batch.q, k, v, batch.tables, plan, D**-0.5, out_t)
            times, err = [], 0.0
            for cfg in configs:
                kernel.configs, kernel.cache = [cfg], {}  # type: ignore[attr-defined]
                fn()
                if ref is None:
                    ref = out_t.float().clone()
                err = max(err, (out_t.float() - ref).abs().max().item())
                assert err < 0.5, (name, label, cfg)
                times.append(bench_graph(fn))
            best = int(np.argmin(times))
            lines.append(f"| {name} | {label} | {times[best]:.3f} | {_tile(configs[best])} | {max(times):.3f} | {err:.3f} | "
                         + " ".join(f"{_tile(c)}={t:.3f}" for c, t in zip(configs, times, strict=True)) + " |")
            print(lines[-1], flush=True)
            del k, v
        del batch
        torch.cuda.empty_cache()
    kernel.configs, kernel.cache = configs, {}  # type: ignore[attr-defined]
    emit(lines, out)


def _tile(c: triton.Config) -> str:
    return f"{c.kwargs['BLOCK_N']}/{c.num_warps}/{c.num_stages}"


if __name__ == "__main__":
    main()
