"""Opt-in (``TESSEL_GEMV=1``): decode-sized bf16/fp16 linear layers (up to ``MAX_M`` tokens) on our
GEMM kernel instead of cuBLAS, for the weight shapes pinned per device below; every other call
stays with cuBLAS.

At batch 1 a GEMV of a 10-50 MB weight takes ~5 us more than its bytes need: the kernel's pipeline
fills, then drains, and the next kernel starts only after. cuBLAS's kernel cannot overlap that.
Ours (kernels/quant/gemm.py, the W8A8 kernel on bf16 operands, an in-kernel split-K) is launched
with programmatic dependent launch like the decode step's other kernels, and asks L2 for the first
lines of its weight rows before it waits for the kernel before it: the weight streams in while
the previous norm, attention or GEMV finishes. Alone, graph-replayed at M = 1 on an H200, its best
tiles ran 0.90-1.06x cuBLAS's speed (``benchmarks/gemv_dot.py``, ``results/decode_h200.md``).

Off by default because it did not measurably win: in ``benchmarks/decode_profile.py``'s A/B of
Llama-3.1-8B batch-1 decode it was 1-2% faster than cuBLAS on one machine and 1-3% slower on
another (results/decode_h200.md). It stays as the tested base for fusing the ops around a GEMV.
``TESSEL_GEMV_MAX_MB`` keeps it to weights up to that size.
"""

from __future__ import annotations

import functools
import os

import torch
import triton

from tessel.kernels.quant import gemm

MAX_M = 16  # the kernel's row tile: up to here a call costs what M = 1 costs

# (N, K) -> (BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_K): gemv_dot.py's best per weight.
# Llama-3.2-1B's four projections and Llama-3.1-8B's qkv_proj and o_proj; the 8B's gate_up_proj
# (235 MB) and down_proj (117 MB) stay with cuBLAS, whose kernels stream them 3-7% faster than
# ours, which the overlap does not make up: 8B batch-1 decode, one run, variants alternating, gave
# 212-213 tok/s with the two small ones on ours, 208-209 with all four, 208-210 with none. The
# 1B's runs spread 30% either way (its step is host-paced there), so its rows rest on the same
# rule: weights up to 100 MB.
_PINNED: dict[str, dict[tuple[int, int], tuple[int, int, int, int, int]]] = {"NVIDIA H200": {
    (6144, 4096): (64, 256, 4, 4, 1), (4096, 4096): (64, 128, 4, 6, 2),
    (3072, 2048): (64, 128, 4, 6, 2), (2048, 2048): (32, 128, 4, 6, 2),
    (16384, 2048): (128, 128, 4, 6, 1), (2048, 8192): (64, 128, 4, 6, 4),
}}


@functools.cache
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device)


def tile_config(block_n: int, block_k: int, warps: int, stages: int, split_k: int) -> triton.Config:
    return triton.Config({"BLOCK_M": MAX_M, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 1, "SPLIT_K": split_k},
                         num_warps=warps, num_stages=stages)


def config_for(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> triton.Config | None:
    """The pinned tile for ``x @ weight.T`` on this device, or None for cuBLAS."""
    if (bias is not None or x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype
            or x.numel() > MAX_M * x.shape[-1] or x.stride(-1) != 1 or weight.stride(-1) != 1
            or os.environ.get("TESSEL_GEMV", "0") != "1"):
        return None
    shape = _PINNED.get(_device_name(x.device), {}).get((weight.shape[0], weight.shape[1]))
    limit = os.environ.get("TESSEL_GEMV_MAX_MB")
    if shape is None or (limit is not None and weight.numel() * weight.element_size() > float(limit) * 1e6):
        return None
    return tile_config(*shape)


def linear(x: torch.Tensor, weight: torch.Tensor, config: triton.Config) -> torch.Tensor:
    """``x @ weight.T`` for a ``config`` from config_for (or a test's)."""
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.empty(x2.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    gemm.launch_raw(x2, weight, out, config)
    return out.view(*x.shape[:-1], weight.shape[0])
