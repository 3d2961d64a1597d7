"""W8A8 GEMM tile sweep on the GPU, timed the way the engine runs it: from a CUDA graph.

``do_bench`` on a single ~15 us launch times Python as much as the GPU (the autotuned path's
launch costs more than the kernel), and the first sweep read that as a slow kernel. Here every
variant is captured into one CUDA graph that cycles over enough copies of the weight to exceed
the L2, so each call streams its weight from HBM as in a real step and no launch cost is
counted. For each Llama-3.1-8B layer shape and M: bf16 ``F.linear``, the autotuner's pick, and
every config of a grid, with the weight-read roofline beside them. The winners are what
``gemm_configs._DECODE`` / ``_PREFILL`` should hold.

    PYTHONPATH=. python3 benchmarks/quant_sweep.py [--dtype int8|fp8] [--ms 16 64 256] [--out sweep.md]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
import triton

from benchmarks.quant import SHAPES, operands
from benchmarks.report import emit
from tessel.kernels.quant import gemm, gemm_configs

L2_BYTES = 60 << 20  # H200: 50 MiB of L2; the rotation covers more than that
# (BLOCK_N, BLOCK_K, warps, stages) for decode buckets; BLOCK_M is the bucket
DECODE_GRID = [(bn, bk, w, s) for bn, bk, w, s in itertools.product((16, 32, 64, 128), (128, 256, 512), (4, 8), (3, 5))
               if not (w == 8 and bn < 64)]  # 8 warps on a 16- or 32-wide tile leaves warps without work
# (BLOCK_N, BLOCK_K, warps, stages, SPLIT_K) for decode buckets with split-K (--split): wide tiles
# re-read the activations less; the split brings the program count back up to the SMs'
SPLIT_GRID = [(32, 256, 4, 5, 1), (64, 256, 4, 5, 1)] + [
    (bn, bk, w, st, sk) for bn, bk, w, st, splits in
    [(64, 256, 4, 5, (2, 4)), (128, 256, 4, 4, (1, 2, 3, 4, 6)), (128, 128, 4, 5, (2, 4, 8)), (256, 128, 8, 3, (2, 4, 8))]
    for sk in splits]
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, SPLIT_K) past the decode buckets with --split
SPLIT_PREFILL_GRID = [(bm, bn, bk, w, st, sk) for (bm, bn, bk, w, st), sk in itertools.product(
    [(64, 128, 128, 4, 4), (128, 128, 128, 8, 3), (128, 64, 128, 4, 4), (64, 64, 128, 4, 4)], (1, 2, 4))]
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) for M past the decode buckets
PREFILL_GRID = [(bm, bn, bk, w, s) for bm, bn, bk, w, s in
                itertools.product((64, 128), (64, 128, 256), (128, 256), (4, 8), (3, 4))
                if not (bm == 128 and bn == 256 and bk == 256)]  # over shared memory at 3+ stages


def graph_us(calls: list[Callable[[], Any]]) -> float:
    """Median us per call, the calls replayed from one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiles and autotunes outside the capture
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = triton.testing.do_bench(graph.replay, warmup=5, rep=60, return_mode="median")
    return float(ms) * 1e3 / len(calls)


def tile(m: int, cfg: tuple[int, ...]) -> triton.Config:
    if len(cfg) == 5 and m <= gemm_configs.SMALL_M:  # a SPLIT_GRID entry
        return gemm_configs.tile_config(gemm_configs.m_bucket(m), *cfg[:4], True, cfg[4])
    if len(cfg) == 6:  # a SPLIT_PREFILL_GRID entry
        return gemm_configs.tile_config(*cfg[:5], False, cfg[5])
    bm, bn, bk, w, s = (gemm_configs.m_bucket(m), *cfg) if len(cfg) == 4 else cfg
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)


def sweep_shape(
    n: int, k: int, m: int, key: str, split: bool = False
) -> tuple[float, float, list[tuple[float, tuple[int, ...]]]]:
    """bf16 and autotuned times (us), and every grid config's (us, config), best first."""
    o = operands(m, n, k)
    copies = max(2, math.ceil(L2_BYTES / (n * k)))
    ws = [o[f"w{key}"].clone() for _ in range(copies)]
    wbs = [o["w"].clone() for _ in range(copies)]
    x, xs, wscale = o[f"x{key}"], o[f"x{key}s"], o[f"w{key}s"]

    def ours(config: triton.Config | None) -> list[Callable[[], Any]]:
        return [partial(gemm.scaled_mm, x, xs, w, wscale, None, torch.bfloat16, config=config) for w in ws]

    bf16 = graph_us([partial(F.linear, o["x"], w) for w in wbs])
    tuned = graph_us(ours(None))
    results = []
    if m <= gemm_configs.SMALL_M:
        grid: list[tuple[int, ...]] = list(SPLIT_GRID if split else DECODE_GRID)
    else:
        grid = list(SPLIT_PREFILL_GRID if split else PREFILL_GRID)
    for cfg in grid:
        try:
            results.append((graph_us(ours(tile(m, cfg))), cfg))
        except Exception as exc:  # out of shared memory or registers
            print(f"  N={n} K={k} M={m} {cfg}: {type(exc).__name__}", flush=True)
    return bf16, tuned, sorted(results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["int8", "fp8"], default="int8")
    ap.add_argument("--ms", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--split", action="store_true", help="sweep SPLIT_GRID (split-K) at decode M")
    ap.add_argument("--pins-out", default=None, help="write each shape's best tile as a TESSEL_W8A8_PIN_FILE")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    pins: dict[str, list[int]] = {}
    key = "i" if args.dtype == "int8" else "f"
    lines = [f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
             f"{args.dtype}; CUDA-graph replay over weight copies past the L2; "
             f"{len(SPLIT_GRID if args.split else DECODE_GRID)} decode / {len(PREFILL_GRID)} prefill configs", "",
             "| layer | M | weight MB | roofline us | bf16 us | autotuned us | best us | best config "
             "| 2nd | best vs bf16 | best vs autotuned |", "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    # One 4 GiB copy is not launch-bound; a captured one was slower (2.8 against 4.3 TB/s)
    copy = 2 * src.numel() * 2 / (triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3)
    # A config's total time over the shapes of a bucket: what one table entry per bucket costs
    per_bucket: dict[int, dict[tuple[int, ...], float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for (name, (n, k)), m in itertools.product(SHAPES.items(), args.ms):
        bf16, tuned, ranked = sweep_shape(n, k, m, key, args.split)
        (best_us, best), (second_us, second) = ranked[0], ranked[1]
        for us, cfg in ranked:
            per_bucket[m][cfg] += us
        if tuned > best_us * 1.03:  # a clear win over what ships
            full = {4: (gemm_configs.m_bucket(m), *best, 1), 5: (gemm_configs.m_bucket(m), *best),
                    6: best}.get(len(best), (*best, 1))
            pins[f"{args.dtype},{gemm_configs.m_bucket(m)},{n},{k}"] = list(full)
        lines.append(f"| {name} | {m} | {n * k / 1e6:.0f} | {n * k / copy * 1e6:.1f} | {bf16:.1f} | {tuned:.1f} | "
                     f"{best_us:.1f} | {best} | {second} {second_us:.1f} | {bf16 / best_us:.2f}x | {tuned / best_us:.2f}x |")
        print(lines[-1], flush=True)
    lines.append(f"\ncopy bandwidth (read+write) {copy / 1e12:.2f} TB/s; roofline = the weight read once at it")
    for m, totals in per_bucket.items():
        top = sorted((us, cfg) for cfg, us in totals.items())[:4]
        lines.append(f"M={m}: best single configs over all shapes (sum us): "
                     + ", ".join(f"{cfg} {us:.0f}" for us, cfg in top))
    emit(lines, args.out)
    if args.pins_out:  # merged into the file's pins (one run per dtype)
        if os.path.exists(args.pins_out):
            with open(args.pins_out) as f:
                pins = json.load(f) | pins
        with open(args.pins_out, "w") as f:
            json.dump(pins, f, indent=1)


if __name__ == "__main__":
    main()
