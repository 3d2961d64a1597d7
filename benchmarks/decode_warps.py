"""Decode attention: the tile walk (``decode.py``) against the warp-split walk (``decode_warps.py``).

Same cases and timing as ``decode_occupancy.py`` (Llama-3.1-8B attention shape, balanced plan,
``LAYERS`` layers a CUDA-graph replay, each over its own cache; ms per layer, decode + merge):
the tile walk at its two best-known tiles, the warp split at each of its tiles, over a bf16
cache, an E4M3 one, and E4M3 with fp16 dots. Outputs are checked against the case's first.

    PYTHONPATH=. python3 benchmarks/decode_warps.py [--out decode_warps.md]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import triton

from benchmarks.attention import HKV, HQ, D, bench_graph, make_decode_batch
from benchmarks.decode_occupancy import LAYERS, VARIANTS, layer_fn
from benchmarks.report import emit
from tessel.kernels.attention import decode, decode_warps
from tessel.kernels.attention.decode import DecodeConfig, build_decode_plan

CASES = {"b=256 x 140 (engine)": np.full(256, 140), "b=256 x 512": np.full(256, 512), "b=64 x 4K": np.full(64, 4096)}
WALK = [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s) for n, w, s in ((32, 4, 6), (128, 4, 3))]
# the split's tiles, and two capped at 168 registers (3 programs of 4 warps or 6 of 2 an SM,
# 72-112 B spilled when compiled for sm_90; uncapped they take 255: decode_warps_compile_cpu.md)
SPLIT = decode_warps.tile_configs(tuned=True) + [
    triton.Config({"BLOCK_N": 16, "SPLIT": s}, num_warps=s, num_stages=4, maxnreg=168) for s in (4, 2)]


def label(warps: bool, c: triton.Config) -> str:
    n, w, s = c.kwargs["BLOCK_N"], c.num_warps, c.num_stages
    cap = f" r{c.maxnreg}" if c.maxnreg else ""
    return (f"split {c.kwargs['SPLIT']}x{n}/{w}/{s}" if warps else f"walk {n}/{w}/{s}") + cap


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=150.0)
    args = ap.parse_args()
    start = time.perf_counter()
    runs = [(False, c) for c in WALK] + [(True, c) for c in SPLIT]
    lines = [f"device: {torch.cuda.get_device_name()}; ms per layer (decode + merge), {LAYERS} layers a graph", "",
             "| case | cache | " + " | ".join(label(w, c) for w, c in runs) + " | best walk / best split |",
             "|---|---|" + "---:|" * (len(runs) + 1)]
    for name, lens in CASES.items():
        batch = make_decode_batch(lens)
        plan = build_decode_plan(lens, HQ, HKV, D, torch.device("cuda"), DecodeConfig())
        ref = None
        for vname, (dtype, f16) in VARIANTS.items():
            os.environ["TESSEL_FP8_F16"] = f16
            run, out = layer_fn(batch, dtype, plan)
            times = []
            for warps, config in runs:
                if time.perf_counter() - start > args.budget_s:
                    times.append(float("nan"))
                    continue
                os.environ["TESSEL_DECODE_WARPS"] = "1" if warps else "0"
                kernel = decode_warps.decode_warps_kernel if warps else decode._decode_kernel
                kernel.configs, kernel.cache = [config], {}  # type: ignore[attr-defined]
                run()
                if ref is None:
                    ref = out.float().clone()
                err = (out.float() - ref).abs().max().item()
                times.append(bench_graph(run) / LAYERS if err < 0.5 else float("inf"))
            walk, split = np.nanmin(times[:len(WALK)]), np.nanmin(times[len(WALK):])
            lines.append(f"| {name} | {vname} | " + " | ".join(f"{t:.4f}" for t in times) + f" | {walk / split:.2f}x |")
            print(lines[-1], flush=True)
            del run, out
        del batch
        torch.cuda.empty_cache()
    for var in ("TESSEL_FP8_F16", "TESSEL_DECODE_WARPS"):
        os.environ.pop(var, None)
    lines.append(f"\ntotal {time.perf_counter() - start:.0f} s (inf: output off by more than 0.5; nan: not run)")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
