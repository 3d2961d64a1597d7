"""Decode attention over the paged cache stored token-major (NHD) or head-major (HND) per block.

The engine's cache is [blocks, page, KV heads, D] (NHD): one program of the decode kernel, which
serves one KV head, reads a 16-token page as 16 rows of D elements a KV-head stride apart (1 KB
for Llama-3.1-8B's 8 heads x 128 in E4M3). Stored [blocks, KV heads, page, D] (HND, FlashInfer's
other layout) the same page is one contiguous run (2 KB in E4M3). The kernels take strides, so
HND is the same tensor shape over a transposed allocation. ``decode_occupancy.py`` found the fp8
cache's kernel no faster than bf16's at short contexts whatever its occupancy: the question here
is whether that is the scattered rows.

Every timed call runs ``LAYERS`` layers of decode attention, each over its own cache, replayed
from a CUDA graph; ms per layer (decode + merge). Outputs of both layouts are checked equal.

    PYTHONPATH=. python3 benchmarks/kv_layout.py [--out kv_layout.md]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import triton

from benchmarks.attention import HKV, HQ, D, bench_graph, copy_bandwidth, make_decode_batch
from benchmarks.decode_occupancy import LAYERS, layer_fn
from benchmarks.report import emit
from tessel.kernels.attention import decode as decode_mod
from tessel.kernels.attention.decode import DecodeConfig, build_decode_plan

CASES = {
    "b=256 x 140 (engine)": np.full(256, 140),
    "b=256 x 512": np.full(256, 512),
    "b=64 x 4K": np.full(64, 4096),
    "b=256 lognormal (median 1K)": np.clip(
        np.random.default_rng(0).lognormal(np.log(1024), 1.3, 256), 1, 16384).astype(np.int64),
}
TILES = [(32, 4, 6), (32, 4, 4), (64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3)]  # BLOCK_N, warps, stages
VARIANTS = {"bf16": (torch.bfloat16, "0"), "fp8": (torch.float8_e4m3fn, "0"), "fp8 f16 dots": (torch.float8_e4m3fn, "1")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=240.0)
    args = ap.parse_args()
    start = time.perf_counter()
    kernel = decode_mod._decode_kernel
    bw = copy_bandwidth()
    lines = [f"device: {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s (read + write); "
             f"ms per layer, {LAYERS} layers per graph; % bw: the cache's bytes over the best time against it", "",
             "| case | variant | NHD best ms | tile | HND best ms | tile | NHD / HND | NHD % bw | HND % bw | "
             + " | ".join(f"{n}/{w}/{s} NHD, HND" for n, w, s in TILES) + " |",
             "|---|---|---:|---|---:|---|---:|---:|---:|" + "---|" * len(TILES)]
    for name, lens in CASES.items():
        batch = make_decode_batch(lens)
        plan = build_decode_plan(lens, HQ, HKV, D, torch.device("cuda"), DecodeConfig())
        for vname, (dtype, f16) in VARIANTS.items():
            os.environ["TESSEL_FP8_F16"] = f16
            times: dict[str, list[float]] = {}
            outs: dict[str, torch.Tensor] = {}
            for layout in ("NHD", "HND"):
                run, out = layer_fn(batch, dtype, plan, layout)
                times[layout] = []
                for n, w, s in TILES:
                    if time.perf_counter() - start > args.budget_s:
                        times[layout].append(float("nan"))
                        continue
                    kernel.configs, kernel.cache = [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s)], {}
                    run()
                    outs.setdefault(layout, out.float().clone())
                    times[layout].append(bench_graph(run) / LAYERS)
                del run
            err = (outs["NHD"] - outs["HND"]).abs().max().item() if len(outs) == 2 else float("nan")
            assert not err > 1e-2, (name, vname, err)
            bytes_ = int(lens.sum()) * HKV * D * 2 * torch.empty((), dtype=dtype).element_size()
            nb, hb = (int(np.nanargmin(times[lay])) if not np.all(np.isnan(times[lay])) else 0 for lay in ("NHD", "HND"))
            tn, th = times["NHD"][nb], times["HND"][hb]
            lines.append(
                f"| {name} | {vname} | {tn:.4f} | {'/'.join(map(str, TILES[nb]))} | {th:.4f} | "
                f"{'/'.join(map(str, TILES[hb]))} | {tn / th:.2f}x | {100 * bytes_ / (tn * 1e-3) / bw:.0f} | "
                f"{100 * bytes_ / (th * 1e-3) / bw:.0f} | "
                + " | ".join(f"{a:.4f}, {b:.4f}" for a, b in zip(times["NHD"], times["HND"], strict=True)) + " |")
            print(lines[-1], flush=True)
        del batch
        torch.cuda.empty_cache()
    os.environ.pop("TESSEL_FP8_F16", None)
    kernel.configs, kernel.cache = decode_mod._decode_configs(), {}  # type: ignore[attr-defined]
    lines.append(f"\ntotal {time.perf_counter() - start:.0f} s")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
