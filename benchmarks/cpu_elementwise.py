"""The CPU engine's C elementwise kernels against the torch references, per op, at SmolLM2-135M's
shapes (hidden 576, intermediate 1536, 9 q / 3 kv heads of 64), fp32, torch's thread count.

Rows: 1 and 32 (decode batches) and 2048 (a prefill chunk). Times are medians of many calls
with time.perf_counter (CPU ops are synchronous); "GB/s" is the bytes an op must read and
write once over its C time. On a shared machine the numbers are rough.

    PYTHONPATH=. python benchmarks/cpu_elementwise.py [--rows 1 32 2048]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from tessel.kernels import cpu_elementwise, reference

HIDDEN, INTER, HQ, HKV, HEAD_DIM, MAX_POS = 576, 1536, 9, 3, 64, 8192


def _median_us(fn: Callable[[], object], min_time: float = 0.2) -> float:
    for _ in range(10):
        fn()
    times: list[float] = []
    deadline = time.perf_counter() + min_time
    while time.perf_counter() < deadline or len(times) < 20:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _cases(rows: int) -> list[tuple[str, int, Callable[[], object], Callable[[], object]]]:
    """(op, bytes moved, reference call, C call) at ``rows`` tokens."""
    g = torch.Generator().manual_seed(0)
    x, res = torch.randn(rows, HIDDEN, generator=g), torch.randn(rows, HIDDEN, generator=g)
    w = torch.randn(HIDDEN, generator=g)
    gate_up = torch.randn(rows, 2 * INTER, generator=g)
    qkv = torch.randn(rows, (HQ + 2 * HKV) * HEAD_DIM, generator=g)
    q = qkv[:, : HQ * HEAD_DIM].view(rows, HQ, HEAD_DIM)
    k = qkv[:, HQ * HEAD_DIM: (HQ + HKV) * HEAD_DIM].view(rows, HKV, HEAD_DIM)
    cache = torch.randn(MAX_POS, HEAD_DIM, generator=g)
    pos = torch.randint(0, MAX_POS, (rows,), generator=g)
    f = 4  # bytes per fp32
    qk = rows * (HQ + HKV) * HEAD_DIM
    return [
        ("rms_norm", 2 * rows * HIDDEN * f,
         lambda: reference.rms_norm(x, w, 1e-5), lambda: cpu_elementwise.rms_norm(x, w, 1e-5)),
        ("fused_add_rms_norm", 4 * rows * HIDDEN * f,
         lambda: reference.fused_add_rms_norm(x, res, w, 1e-5),
         lambda: cpu_elementwise.fused_add_rms_norm(x, res, w, 1e-5)),
        ("silu_and_mul", 3 * rows * INTER * f,
         lambda: reference.silu_and_mul(gate_up), lambda: cpu_elementwise.silu_and_mul(gate_up)),
        ("apply_rope", (2 * qk + rows * HEAD_DIM) * f,
         lambda: reference.apply_rope(q, k, pos, cache), lambda: cpu_elementwise.apply_rope(q, k, pos, cache)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32, 2048])
    args = parser.parse_args()
    if cpu_elementwise.kernels() is None:
        raise SystemExit("the C kernels are not available here (no compiler, or TESSEL_CPU_KERNELS is off)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32")
    print(f"| {'op':<20} | {'rows':>5} | {'reference us':>12} | {'C us':>8} | {'speed-up':>8} | {'C GB/s':>6} |")
    print(f"|{'-' * 22}|{'-' * 7}|{'-' * 14}|{'-' * 10}|{'-' * 10}|{'-' * 8}|")
    for rows in args.rows:
        for op, nbytes, ref_fn, c_fn in _cases(rows):
            ref_us, c_us = _median_us(ref_fn), _median_us(c_fn)
            print(f"| {op:<20} | {rows:>5} | {ref_us:>12.1f} | {c_us:>8.1f} | {ref_us / c_us:>7.2f}x | "
                  f"{nbytes / c_us / 1e3:>6.1f} |")


if __name__ == "__main__":
    main()
