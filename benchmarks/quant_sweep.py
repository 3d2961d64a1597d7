"""W8A8 GEMM tile sweep at decode batch sizes, on the GPU.

``quant_h200.md`` shows our int8 GEMM slower than torch's bf16 matmul at M = 16 and 64 on
qkv_proj (0.27x, 0.32x) and o_proj (0.75x), where reading half the weight bytes should make it
up to 2x faster. That is most of why int8 decode measured 1.32x rather than 1.4x. For each
Llama-3.1-8B layer shape and M, this times the autotuner's pick, every config in a wider grid,
and bf16 ``torch.matmul``, with the weight-read roofline beside them. The winners are what
``gemm_configs._DECODE`` should hold.

    PYTHONPATH=. python3 benchmarks/quant_sweep.py [--dtype int8|fp8] [--out sweep.md]
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial

import torch
import triton

from benchmarks.quant import SHAPES, bench_ms, operands
from benchmarks.report import emit
from tessel.kernels.quant import gemm, gemm_configs

MS = (16, 64)
GRID = [(bn, bk, w, s) for bn, bk, w, s in itertools.product((16, 32, 64, 128), (128, 256, 512), (4, 8), (3, 5))
        if not (w == 8 and bn < 64)]  # 8 warps on a 16- or 32-wide tile leaves warps without work


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 2 GiB device copy."""
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / (bench_ms(lambda: dst.copy_(src)) * 1e-3)


def sweep_shape(n: int, k: int, m: int, key: str) -> tuple[float, float, float, tuple[int, ...]]:
    """bf16 matmul, autotuned and best-of-GRID times (us) and the best config, for one shape."""
    o = operands(m, n, k)
    mm = partial(gemm.scaled_mm, o[f"x{key}"], o[f"x{key}s"], o[f"w{key}"], o[f"w{key}s"], None, torch.bfloat16)
    bf16 = bench_ms(partial(torch.matmul, o["x"], o["w"].T)) * 1e3
    tuned = bench_ms(mm) * 1e3
    results = []
    for bn, bk, w, s in GRID:
        cfg = triton.Config({"BLOCK_M": gemm_configs.m_bucket(m), "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                            num_warps=w, num_stages=s)
        try:
            results.append((bench_ms(partial(mm, config=cfg)) * 1e3, (bn, bk, w, s)))
        except Exception as exc:  # out of shared memory or registers
            print(f"  N={n} K={k} M={m} {(bn, bk, w, s)}: {type(exc).__name__}", flush=True)
    best_us, best = min(results)
    return bf16, tuned, best_us, best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["int8", "fp8"], default="int8")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    key = "i" if args.dtype == "int8" else "f"
    lines = [f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; "
             f"{args.dtype}, {len(GRID)} configs (BLOCK_M = the M bucket)", "",
             "| layer | M | weight MB | roofline us | bf16 us | autotuned us | best us | best (BLOCK_N, BLOCK_K, warps, stages) "
             "| best vs bf16 | best vs autotuned |", "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    copy = copy_bandwidth()
    for (name, (n, k)), m in itertools.product(SHAPES.items(), MS):
        bf16, tuned, best_us, best = sweep_shape(n, k, m, key)
        lines.append(f"| {name} | {m} | {n * k / 1e6:.0f} | {n * k / copy * 1e6:.1f} | {bf16:.1f} | {tuned:.1f} | "
                     f"{best_us:.1f} | {best} | {bf16 / best_us:.2f}x | {tuned / best_us:.2f}x |")
        print(lines[-1], flush=True)
    lines.append(f"\ncopy bandwidth (read+write) {copy / 1e12:.2f} TB/s; roofline = the weight read once at it")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
