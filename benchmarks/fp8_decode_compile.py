"""The decode kernels over a bf16 and an E4M3 cache, compiled for sm_90 on this machine: no GPU.
``cp.async`` counts the K/V (and query) tile loads Triton's software pipeline issues.

Triton compiles to PTX and runs ptxas (both ship in its wheel) for any target, so the code a
kernel becomes on a Hopper GPU can be read without one. Per variant: registers and spills
(cuobjdump), shared memory, and the PTX instructions that separate the variants: shared-memory
loads by width (``ld.shared.b8`` is a single byte), ``ldmatrix`` (16-bit operand tiles), and the
conversions. Counts are static (instructions in the code, not executions); the inner loop is
unrolled the same way in every variant. The Triton here need not be the GPU machine's.

    PYTHONPATH=. python3 benchmarks/fp8_decode_compile.py [--out results.md]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.report import emit
from tessel.kernels.attention import decode

TARGET = GPUTarget("cuda", 90, 32)
INTS = ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_kb", "stride_ks", "stride_kh", "stride_vb",
        "stride_vs", "stride_vh", "stride_bt", "num_tiles", "bucket_off", "first_off", "count_off", "num_q_heads")
# as at run time: Triton specializes these on divisibility by 16, except the step-varying ones
UNALIGNED = {"qk_scale", "num_q_heads", "stride_bt", "num_tiles", "bucket_off", "first_off", "count_off"}
PATTERN = re.compile(
    r"\b(ld\.shared[.a-z0-9]*|st\.shared[.a-z0-9]*|ldmatrix[.a-z0-9]*|cvt[.a-z0-9]*|mma[.a-z0-9]*|cp\.async\.c[ag][.a-z0-9]*)")


def compile_decode(kernel: Any, kv: str, constexprs: dict[str, Any], warps: int, stages: int) -> Any:
    """Llama-3.1-8B's attention shape: head_dim 128, 4 query heads per KV head, 16-token pages."""
    pointers = {"k_ptr": f"*{kv}", "v_ptr": f"*{kv}", "block_tables_ptr": "*i32", "sched_ptr": "*i32",
                "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "q_ptr": "*bf16", "out_ptr": "*bf16"}
    signature: dict[str, str] = {name: pointers[name] for name in (
        "q_ptr", "k_ptr", "v_ptr", "out_ptr", "part_out_ptr", "part_lse_ptr", "block_tables_ptr", "sched_ptr")}
    signature["qk_scale"] = "fp32"
    signature |= {name: "i32" for name in INTS}
    signature |= {name: "constexpr" for name in constexprs}
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
             if kind != "constexpr" and name not in UNALIGNED}
    src = ASTSource(kernel.fn, signature, constexprs, attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": warps, "num_stages": stages})


def registers(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, spill stack bytes) from cuobjdump."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    path = Path("/tmp/tessel_decode.cubin")
    path.write_bytes(cubin)
    usage = subprocess.run([str(tool), "--dump-resource-usage", str(path)], capture_output=True, text=True).stdout
    reg = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return int(reg.group(1)) if reg else -1, int(stack.group(1)) if stack else -1


def variants() -> dict[str, tuple[Any, str, dict[str, Any], int, int]]:
    base = {"HEAD_DIM": 128, "GROUP": 4, "PAGE": 16, "PDL": False}
    tc = base | {"GROUP_PAD": 16, "DOT_PRECISION": "tf32", "BLOCK_N": 64}
    return {
        "tensor cores, bf16 cache": (decode._decode_kernel, "bf16", tc | {"KV_FP8": False, "F16_DOTS": False, "V_WORDS": False}, 4, 3),
        "tensor cores, fp8 cache, V as words (default)": (
            decode._decode_kernel, "fp8e4nv", tc | {"KV_FP8": True, "F16_DOTS": False, "V_WORDS": True}, 4, 3),
        "tensor cores, fp8 cache, V as words, fp16 dots": (
            decode._decode_kernel, "fp8e4nv", tc | {"KV_FP8": True, "F16_DOTS": True, "V_WORDS": True}, 4, 3),
        "tensor cores, fp8 cache, V as bytes": (
            decode._decode_kernel, "fp8e4nv", tc | {"KV_FP8": True, "F16_DOTS": False, "V_WORDS": False}, 4, 3),
        "tensor cores, fp8 cache, V as bytes, fp16 dots": (
            decode._decode_kernel, "fp8e4nv", tc | {"KV_FP8": True, "F16_DOTS": True, "V_WORDS": False}, 4, 3),
    }


def _count(ops: collections.Counter[str], pred: Callable[[str], bool]) -> int:
    return sum(n for op, n in ops.items() if pred(op))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = [f"Triton {triton.__version__}, target sm_90; BLOCK_N 64, 4 warps, 3 stages for the tensor-core kernel", "",
             "| variant | regs | spill B | smem B | ld.shared.b8 | ld.shared (wider) | ldmatrix | mma | e4m3 cvt | other cvt to f16/bf16 "
             "| cp.async |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, (kernel, kv, constexprs, warps, stages) in variants().items():
        compiled = compile_decode(kernel, kv, constexprs, warps, stages)
        regs, spill = registers(compiled.asm["cubin"])
        ops = collections.Counter(PATTERN.findall(compiled.asm["ptx"]))
        wide_lds = _count(ops, lambda op: op.startswith("ld.shared") and op != "ld.shared.b8")
        half_cvt = _count(ops, lambda op: op.startswith(("cvt.bf16", "cvt.rn.bf16", "cvt.f16", "cvt.rn.f16"))
                          and "e4m3" not in op)
        lines.append(
            f"| {name} | {regs} | {spill} | {compiled.metadata.shared} | {ops['ld.shared.b8']} | {wide_lds} | "
            f"{_count(ops, lambda op: op.startswith('ldmatrix'))} | {_count(ops, lambda op: op.startswith('mma'))} | "
            f"{_count(ops, lambda op: 'e4m3' in op)} | {half_cvt} | {_count(ops, lambda op: op.startswith('cp.async'))} |")
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
