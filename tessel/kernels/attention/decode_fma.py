"""Split-KV paged decode attention on the CUDA cores, for an E4M3 cache: ``decode.py``'s tile walk
without tensor cores.

A decode tile is a few query heads (a GQA group) against many cached tokens: tensor cores waste
most of their 16 rows on it, and an fp8 cache must be widened and turned into their operand
layouts, which Triton does a byte at a time through shared memory. Here each thread widens the
K/V bytes it loaded (``VEC`` of a row) and multiplies them with fp32 FMAs, and each of the
tile's ``BLOCK_N`` token slots keeps its own running max, sum and output: the online softmax
needs no reduction across threads inside the loop, only one merge of the slots at the end.
The next tile's K/V bytes are loaded before the current one is used, so their latency overlaps.
"""

from __future__ import annotations

import os
from typing import Any

import triton
import triton.language as tl

from tessel.kernels.attention.merge import bucket_tiles, store_tile_output, tile_span
from tessel.kernels.autotune import autotune_enabled
from tessel.kernels.specialization import step_varying

MAX_GROUP = 8  # query heads per KV head: the registers grow with the group (tensor cores above)


def enabled(group: int) -> bool:
    """Opt-in (TESSEL_DECODE_FMA=1) until measured against the tensor-core kernel on an fp8 cache."""
    return os.environ.get("TESSEL_DECODE_FMA", "0") == "1" and group <= MAX_GROUP


def launch(grid: tuple[int, int], args: tuple[Any, ...], head_dim: int, group: int, page: int, **launch_opts: Any) -> None:
    """``args``: ``decode._decode_kernel``'s positional arguments, which this kernel shares."""
    _decode_fma_kernel[grid](*args, HEAD_DIM=head_dim, GROUP=group, GROUP_PAD=triton.next_power_of_2(group),
                             PAGE=page, **launch_opts)


def _fma_configs() -> list[triton.Config]:
    # (BLOCK_N, warps, VEC): VEC bytes of a row per thread; the registers grow with BLOCK_N x G x D / threads
    shapes = [(16, 8, 4)]
    if autotune_enabled():
        shapes += [(16, 4, 4), (32, 8, 8), (32, 8, 16), (8, 4, 4), (32, 16, 8), (16, 8, 8), (8, 2, 8)]
    return [triton.Config({"BLOCK_N": n, "VEC": vec}, num_warps=w, num_stages=1) for n, w, vec in shapes]


@triton.jit
def _load_tile(k_base, v_base, table, pos, end, PAGE: tl.constexpr, stride_kb, stride_ks, stride_vb, stride_vs):
    valid = pos < end
    blk = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
    off = pos % PAGE
    # [1, BLOCK_N, D]: loaded 3-D, so the products with the [G, 1, D] query take the load's layout
    k = tl.load(k_base + (blk * stride_kb + off * stride_ks)[None, :, None], mask=valid[None, :, None], other=0.0)
    v = tl.load(v_base + (blk * stride_vb + off * stride_vs)[None, :, None], mask=valid[None, :, None], other=0.0)
    return k, v


@triton.autotune(configs=_fma_configs(), key=["HEAD_DIM", "GROUP_PAD", "PAGE"])
@triton.jit(do_not_specialize=step_varying("stride_bt", "num_tiles", "bucket_off", "first_off", "count_off"))
def _decode_fma_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    block_tables_ptr, sched_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt,
    num_tiles, bucket_off, first_off, count_off, num_q_heads,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, VEC: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # see kernels/pdl.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    kvh = tl.program_id(1)
    t_lo, t_hi = bucket_tiles(sched_ptr, bucket_off)
    offs_g = tl.arange(0, GROUP_PAD)
    # contiguity capped at VEC: the loads' vector width, so fewer D values (query, output) per thread
    offs_d = tl.max_contiguous(tl.arange(0, HEAD_DIM), VEC)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    k_base = k_ptr + kvh * stride_kh + offs_d[None, None, :]
    v_base = v_ptr + kvh * stride_vh + offs_d[None, None, :]
    for t in range(t_lo, t_hi):
        req, start, end = tile_span(sched_ptr, t, num_tiles)
        q = tl.load(
            q_ptr + req * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=g_mask[:, None], other=0.0,
        ).to(tl.float32) * qk_scale
        # a finite floor: a slot that never sees a valid token must not make inf - inf
        m_i = tl.full([GROUP_PAD, BLOCK_N], -1.0e30, tl.float32)
        l_i = tl.zeros([GROUP_PAD, BLOCK_N], tl.float32)
        acc = tl.zeros([GROUP_PAD, BLOCK_N, HEAD_DIM], tl.float32)
        table = block_tables_ptr + req.to(tl.int64) * stride_bt
        k_next, v_next = _load_tile(k_base, v_base, table, start + offs_n, end, PAGE,
                                    stride_kb, stride_ks, stride_vb, stride_vs)
        for n0 in range(start, end, BLOCK_N):
            k, v = k_next, v_next
            k_next, v_next = _load_tile(k_base, v_base, table, n0 + BLOCK_N + offs_n, end, PAGE,
                                        stride_kb, stride_ks, stride_vb, stride_vs)
            valid = (n0 + offs_n) < end
            s = tl.sum(q[:, None, :] * k.to(tl.float32), axis=2)
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, s)
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new)
            l_i = l_i * alpha + p
            acc = acc * alpha[:, :, None] + p[:, :, None] * v.to(tl.float32)
            m_i = m_new
        m = tl.max(m_i, 1)
        w = tl.exp2(m_i - m[:, None])
        l_sum = tl.sum(l_i * w, 1)
        store_tile_output(tl.sum(acc * w[:, :, None], 1) / l_sum[:, None], m + tl.log2(l_sum), req, t, heads, g_mask,
                          offs_d, out_ptr, part_out_ptr, part_lse_ptr, sched_ptr, count_off, stride_ot, stride_oh,
                          num_q_heads, HEAD_DIM)
