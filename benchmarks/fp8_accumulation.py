"""fp8 GEMM accumulation on Hopper: how often to promote wgmma's reduced-precision sums into fp32.

For each ``gemm.FP8_PROMOTE_K`` (None: never, the backend's default; 128: DeepGEMM's choice;
32: every wgmma), on the Llama-3.1-8B layer shapes: our autotuned fp8 GEMM's time and its
largest error against the fp32 product of the same fp8 operands, relative to the output's range.

    PYTHONPATH=. python3 benchmarks/fp8_accumulation.py [--out fp8_accumulation.md]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import triton

from benchmarks.quant import SHAPES, bench_ms, operands
from benchmarks.report import emit
from tessel.kernels.quant import gemm
from tessel.kernels.quant import reference as ref

SETTINGS = (None, 128, 32)
MS = (16, 256, 4096)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    head = f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}"
    lines = [head, "", "| layer | M | " + " | ".join(f"us / rel err, promote {s}" for s in SETTINGS)
             + " | time x (128 vs None) |", "|" + "---|" * (3 + len(SETTINGS))]
    for name, (n, k) in SHAPES.items():
        for m in MS:
            o = operands(m, n, k)
            want = ref.scaled_mm(o["xf"], o["xfs"], o["wf"], o["wfs"], None, torch.float32)
            cells, times = [], {}
            for setting in SETTINGS:
                gemm.FP8_PROMOTE_K = setting
                gemm._tuned_kernel.cache.clear()  # the tuner's key does not see the setting

                fp8 = partial(gemm.scaled_mm, o["xf"], o["xfs"], o["wf"], o["wfs"], None, torch.float32)

                err = ((fp8() - want).abs().max() / want.abs().max()).item()
                times[setting] = bench_ms(fp8) * 1e3
                cells.append(f"{times[setting]:.1f} / {err:.1e}")
            lines.append(f"| {name} | {m} | " + " | ".join(cells) + f" | {times[128] / times[None]:.2f} |")
            print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
