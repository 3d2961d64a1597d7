"""Instructions per token of the decode kernels' inner loop, compiled for sm_90 on this machine.

The tile walk (``attention/decode.py``) against the warp-split walk (``attention/decode_warps.py``)
over a bf16 and an E4M3 cache: the SASS of the loop over a range's tiles (the innermost loop
holding the tensor-core MMAs), its instructions per token and warp (instructions x warps / tokens
a tile), its barriers, and registers, spills and shared memory. Static counts, no GPU; the
Triton here need not be the GPU machine's. ``fp8_decode_compile.py`` has the PTX-level view.

    PYTHONPATH=. python3 benchmarks/decode_warps_compile.py [--out results.md]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import types
from pathlib import Path
from typing import Any

import triton

from benchmarks.fp8_decode_compile import compile_decode, registers
from benchmarks.report import emit
from tessel.kernels.attention import decode, decode_warps

NVDISASM = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
BASE = {"HEAD_DIM": 128, "GROUP": 4, "PAGE": 16, "PDL": False, "GROUP_PAD": 16, "DOT_PRECISION": "tf32"}
CACHES = {"bf16": ("bf16", {"KV_FP8": False, "F16_DOTS": False}),
          "fp8": ("fp8e4nv", {"KV_FP8": True, "F16_DOTS": False}),
          "fp8, fp16 dots": ("fp8e4nv", {"KV_FP8": True, "F16_DOTS": True})}
# (label, kernel, extra constexprs, warps, stages, tokens a tile)
KERNELS = [("tile walk 32/4/6 (default)", decode._decode_kernel, {"BLOCK_N": 32, "V_WORDS": True}, 4, 6, 32),
           ("warp split 4x16/4/4", decode_warps.decode_warps_kernel, {"BLOCK_N": 16, "SPLIT": 4, "V_WORDS": True}, 4, 4, 64),
           ("warp split 4x32/4/3", decode_warps.decode_warps_kernel, {"BLOCK_N": 32, "SPLIT": 4, "V_WORDS": True}, 4, 3, 128),
           ("warp split 2x16/2/4", decode_warps.decode_warps_kernel, {"BLOCK_N": 16, "SPLIT": 2, "V_WORDS": True}, 2, 4, 32)]


def inner_loop(sass: list[str]) -> list[str]:
    """The shortest backward-branch loop that holds at least 8 MMAs."""
    best: tuple[int, int] | None = None
    for i, line in enumerate(sass):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if not m:
            continue
        lab = next((j for j, text in enumerate(sass) if text.startswith(m.group(1) + ":")), None)
        if lab is not None and lab < i and sum("HMMA" in x for x in sass[lab:i]) >= 8 and (
                best is None or i - lab < best[1] - best[0]):
            best = (lab, i)
    return sass[best[0]:best[1] + 1] if best else []


def row(name: str, kernel: Any, kv: str, constexprs: dict[str, Any], warps: int, stages: int, tokens: int) -> str:
    compiled = compile_decode(types.SimpleNamespace(fn=getattr(kernel, "fn", kernel)), kv, constexprs, warps, stages)
    path = Path("/tmp/tessel_decode_loop.cubin")
    path.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([str(NVDISASM), "-c", str(path)], capture_output=True, text=True).stdout.splitlines()
    ops = collections.Counter(re.findall(r"\*/\s+(?:@!?U?P[0-9T] )?\s*([A-Z0-9]+)", "\n".join(inner_loop(sass))))
    n = sum(ops.values())
    regs, spill = registers(compiled.asm["cubin"])
    top = ", ".join(f"{k} {v}" for k, v in ops.most_common(6))
    return (f"| {name} | {regs} | {spill} | {compiled.metadata.shared} | {tokens} | {n} | {ops['BAR']} | "
            f"{n * warps / tokens:.1f} | {top} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = [f"Triton {triton.__version__}, sm_90, Llama-3.1-8B attention shape (head_dim 128, 4 query heads a KV head, "
             "16-token pages)", ""]
    for cache, (kv, flags) in CACHES.items():
        lines += [f"## {cache} cache", "", "| kernel | regs | spill B | smem B | tokens a tile | loop instrs | BAR | "
                  "instrs per token x warps | most frequent |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for name, kernel, extra, warps, stages, tokens in KERNELS:
            words = {"V_WORDS": flags["KV_FP8"]} if "V_WORDS" in extra else {}  # V as words: fp8 only
            lines.append(row(name, kernel, kv, BASE | flags | extra | words, warps, stages, tokens))
            print(lines[-1], flush=True)
        lines.append("")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
