"""Fused MoE for a handful of tokens (batch-1 decode): two GEMV kernels, no tile schedule.

With T*K far below E, almost every (token, k) pair has an expert of its own, so grouping pairs
by expert buys nothing: the step is one read of K experts' weights, and what costs is the
sort/align ops and BLOCK_M-row tiles that hold one real row. Here kernel 1 runs one program per
(pair, block of I columns) and reads its expert's gate and up rows straight from ``topk_ids``;
kernel 2 runs one program per (token, block of H columns) and walks the token's K experts,
scaling by the routing weight and summing in fp32 in a fixed order, so it writes the final
[T, H] output: no [T*K, H] buffer, no sum, bit-stable run to run.

Weights are [N, K] row-major (the reduction dim contiguous), so each program streams whole
rows and reduces them against one activation vector in registers: memory-bound by design.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _gate_up_gemv_kernel(
    x_ptr, w13_ptr, act_ptr, ids_ptr, H, INTER, stride_xt, stride_we, stride_wn, stride_ap,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    token = pair // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < INTER
    offs_k = tl.arange(0, BLOCK_K)
    g_ptrs = w13_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    u_ptrs = g_ptrs + INTER * stride_wn  # up rows follow the I gate rows
    x_ptrs = x_ptr + token * stride_xt + offs_k
    acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(0, tl.cdiv(H, BLOCK_K)):
        k_ok = offs_k < H - k * BLOCK_K
        a = tl.load(x_ptrs, mask=k_ok, other=0.0).to(tl.float32)
        w_mask = n_ok[:, None] & k_ok[None, :]
        g = tl.load(g_ptrs, mask=w_mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptrs, mask=w_mask, other=0.0).to(tl.float32)
        acc_g += tl.sum(g * a[None, :], axis=1)
        acc_u += tl.sum(u * a[None, :], axis=1)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    act = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(act_ptr + pair * stride_ap + offs_n, act.to(act_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _down_gemv_kernel(
    act_ptr, w2_ptr, out_ptr, weights_ptr, ids_ptr, H, INTER, stride_ap, stride_we, stride_wh, stride_ot,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    token = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < H
    offs_k = tl.arange(0, BLOCK_K)
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):  # unrolled: the K experts' loads can all be in flight
        pair = token * TOP_K + j
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        w_ptrs = w2_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wh + offs_k[None, :]
        a_ptrs = act_ptr + pair * stride_ap + offs_k
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k in range(0, tl.cdiv(INTER, BLOCK_K)):
            k_ok = offs_k < INTER - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(w * a[None, :], axis=1)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        out += acc * tl.load(weights_ptr + pair).to(tl.float32)
    tl.store(out_ptr + token * stride_ot + offs_n, out.to(out_ptr.dtype.element_ty), mask=n_ok)


# On by default: on the H200 it takes 0.056 ms for Qwen3-30B-A3B's T = 1 layer against the grouped
# path's 0.094 ms (benchmarks/results/moe_h200.md). TESSEL_MOE_GEMV=0 turns it off; the GPU tests
# and benchmarks/moe_layer.py force it either way.
GEMV_BY_DEFAULT = os.environ.get("TESSEL_MOE_GEMV", "1") == "1"


def use_gemv(tokens: int, top_k: int, num_experts: int) -> bool:
    """One token's K experts are always distinct; past that, only while pairs are few enough
    next to E that two sharing an expert (and reading its weights twice) stays rare."""
    return tokens == 1 or tokens * top_k * 4 <= num_experts


def fused_moe_gemv(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """``triton_moe.fused_moe`` for few tokens (arguments checked there)."""
    tokens, top_k = topk_ids.shape
    hidden, inter = x.shape[1], w2.shape[2]
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    # 16 rows x 256: 8 KB of each weight per load, and 384 gate/up programs for Qwen3-30B-A3B at T=1
    block_n, block_k = (16, 16) if interpret else (16, 256)
    ids = topk_ids.reshape(-1).contiguous()
    flat_w = topk_weights.reshape(-1).contiguous()
    act = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    _gate_up_gemv_kernel[(tokens * top_k, triton.cdiv(inter, block_n))](
        x, w13, act, ids, hidden, inter, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        TOP_K=top_k, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4,
    )
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    # H columns in blocks of 8: 256 programs for H 2048 at T=1, each streaming K rows-blocks of w2
    down_n = 16 if interpret else 8
    _down_gemv_kernel[(tokens, triton.cdiv(hidden, down_n))](
        act, w2, out, flat_w, ids, hidden, inter, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        TOP_K=top_k, BLOCK_N=down_n, BLOCK_K=block_k, num_warps=4,
    )
    return out
