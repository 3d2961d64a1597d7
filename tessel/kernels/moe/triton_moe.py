"""Fused MoE for routed SwiGLU experts: two grouped GEMMs over the tiles of ``align.py``.

Kernel 1 reads each tile's x rows once and multiplies them by the gate and the up rows of its
expert's w13 in the same loop, so SiLU(gate) * up is formed in registers and only the [rows, I]
activation reaches memory (in tile order, so kernel 2 reads it contiguously). Kernel 2 multiplies
that by the expert's w2, scales each row by its routing weight and writes it to the row of its
(token, k) pair; the K rows of a token are then summed by torch.

Why a [T*K, H] buffer and a sum rather than fp32 atomic adds into [T, H]: the sum has a fixed
order, so the output is bit-identical run to run (atomics land in whatever order the programs
finish), and it costs one extra read and write of T*K*H elements, small next to the weights.
Accumulation is fp32 in both kernels; inputs may be fp32, fp16 or bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels.checks import FLOAT_DTYPES, check_shape, check_tensor
from tessel.kernels.moe import triton_moe_gemv as gemv_path
from tessel.kernels.moe.align import MoeTiles, align_pairs
from tessel.kernels.moe.configs import MoeConfig, pick_config


@triton.jit(do_not_specialize=["num_pairs"])
def _gate_up_kernel(
    x_ptr, w13_ptr, act_ptr, pairs_ptr, tile_expert_ptr, num_tiles_ptr,
    num_pairs, H, INTER, stride_xt, stride_we, stride_wn, stride_am,
    TOP_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    tile = tl.program_id(1)
    if tile >= tl.load(num_tiles_ptr):
        return  # the grid is sized for the worst case; the schedule used fewer tiles
    expert = tl.load(tile_expert_ptr + tile).to(tl.int64)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pairs_ptr + offs_m)
    valid = pairs < num_pairs  # padding rows load zeros and store zeros
    tokens = tl.where(valid, pairs // TOP_K, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < INTER
    offs_k = tl.arange(0, BLOCK_K)

    x_ptrs = x_ptr + tokens[:, None] * stride_xt + offs_k[None, :]
    g_ptrs = w13_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    u_ptrs = g_ptrs + INTER * stride_wn  # up rows follow the I gate rows
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(H, BLOCK_K)):
        left = H - k * BLOCK_K
        a = tl.load(x_ptrs, mask=valid[:, None] & (offs_k[None, :] < left), other=0.0)
        w_mask = n_ok[None, :] & (offs_k[:, None] < left)
        g = tl.load(g_ptrs, mask=w_mask, other=0.0)
        u = tl.load(u_ptrs, mask=w_mask, other=0.0)
        acc_g = tl.dot(a, g, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(a, u, acc_u, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K

    act = acc_g * tl.sigmoid(acc_g) * acc_u
    a_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_n[None, :]
    tl.store(a_ptrs, act.to(act_ptr.dtype.element_ty), mask=n_ok[None, :])


@triton.jit(do_not_specialize=["num_pairs"])
def _down_kernel(
    act_ptr, w2_ptr, out_ptr, weights_ptr, pairs_ptr, tile_expert_ptr, num_tiles_ptr,
    num_pairs, H, INTER, stride_am, stride_we, stride_wh, stride_ot,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    tile = tl.program_id(1)
    if tile >= tl.load(num_tiles_ptr):
        return
    expert = tl.load(tile_expert_ptr + tile).to(tl.int64)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pairs_ptr + offs_m)
    valid = pairs < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < H
    offs_k = tl.arange(0, BLOCK_K)

    a_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w2_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wh + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(INTER, BLOCK_K)):
        left = INTER - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < left, other=0.0)
        w = tl.load(w_ptrs, mask=n_ok[None, :] & (offs_k[:, None] < left), other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    weight = tl.load(weights_ptr + pairs, mask=valid, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    o_ptrs = out_ptr + pairs[:, None].to(tl.int64) * stride_ot + offs_n[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


def _check(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> None:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("w13", w13, ndim=3, dtypes=(x.dtype,), device=x.device)
    check_tensor("w2", w2, ndim=3, dtypes=(x.dtype,), device=x.device)
    experts, two_inter = w13.shape[0], w13.shape[1]
    check_shape("w13", w13, (None, None, x.shape[1]))
    if two_inter % 2:
        raise ValueError(f"w13 must stack gate and up rows (an even dim 1), got shape {tuple(w13.shape)}")
    check_shape("w2", w2, (experts, x.shape[1], two_inter // 2))
    check_tensor("topk_ids", ids, ndim=2, dtypes=(torch.int32, torch.int64), device=x.device)
    check_shape("topk_ids", ids, (x.shape[0], None))
    check_tensor("topk_weights", weights, ndim=2, dtypes=FLOAT_DTYPES, device=x.device)
    check_shape("topk_weights", weights, tuple(ids.shape))


def _launch(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
    top_k: int, tiles: MoeTiles, cfg: MoeConfig,
) -> torch.Tensor:
    """The two kernels over ``tiles``; returns [T*K, H], one weighted row per pair."""
    hidden, inter = x.shape[1], w2.shape[2]
    grid_m = tiles.tile_expert.numel()
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # tf32 only affects fp32 inputs
    blocks = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    act = torch.empty(grid_m * cfg.block_m, inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(triton.cdiv(inter, cfg.block_n), grid_m)](
        x, w13, act, tiles.sorted_pairs, tiles.tile_expert, tiles.num_tiles,
        tiles.num_pairs, hidden, inter, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        TOP_K=top_k, DOT_PRECISION=precision, **blocks,
    )
    out = torch.empty(tiles.num_pairs, hidden, dtype=x.dtype, device=x.device)
    flat_w = weights.reshape(-1).contiguous()
    _down_kernel[(triton.cdiv(hidden, cfg.block_n), grid_m)](
        act, w2, out, flat_w, tiles.sorted_pairs, tiles.tile_expert, tiles.num_tiles,
        tiles.num_pairs, hidden, inter, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        DOT_PRECISION=precision, **blocks,
    )
    return out


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoeConfig | None = None,
    gemv: bool | None = None,
) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t])``, as ``reference.fused_moe``.

    x: [T, H]; w13: [E, 2I, H] (gate rows then up rows); w2: [E, H, I]; top-k weights/ids
    [T, K]. ``config`` pins the tile shape (tests, benchmarks); by default ``pick_config``.
    ``gemv`` forces (True) or bars (False) the few-token path; by default ``use_gemv`` picks
    when that path is enabled (``triton_moe_gemv.GEMV_BY_DEFAULT``).
    """
    _check(x, w13, w2, topk_weights, topk_ids)
    tokens, top_k = topk_ids.shape
    if tokens == 0 or top_k == 0:
        return torch.zeros_like(x)
    if gemv is None:
        gemv = gemv_path.GEMV_BY_DEFAULT and config is None and gemv_path.use_gemv(tokens, top_k, w13.shape[0])
    if gemv:
        return gemv_path.fused_moe_gemv(x, w13, w2, topk_weights, topk_ids)
    cfg = config or pick_config(tokens * top_k, w13.shape[0])
    tiles = align_pairs(topk_ids, w13.shape[0], cfg.block_m)
    out = _launch(x, w13, w2, topk_weights, top_k, tiles, cfg)
    return out.view(tokens, top_k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)
