"""Split-KV paged decode with each warp on its own tokens (opt-in: ``TESSEL_DECODE_WARPS=1``).

The tile walk of ``decode.py`` gives its dots 16 query rows (the GQA group, padded) and spreads
the tile's tokens over the warps, so every tile's row max, row sum and P operand cross warps
through shared memory: 9 barriers a tile, and over an E4M3 cache ~67 instructions per token and
warp against ~44 for bf16. On an H100 that kernel reads an fp8 cache at 36-62% of copy
bandwidth, bf16 at 71-100% (``benchmarks/results/kv_layout_h100.md``): it is bound by its own
instructions, not by memory.

Here the tile is ``[SPLIT, BLOCK_N]`` tokens and the dots are batched over SPLIT (one warp
each), FlashDecoding's split inside the program: each warp keeps its own online softmax over its
chunks of the range, and the SPLIT states are combined once per range, not once per tile.
Compiled for sm_90 (``benchmarks/decode_warps_compile.py``) that is 2-3 barriers a tile and 35-54
instructions per token and warp over an E4M3 cache, at the price of ~255 registers (2 programs of
4 warps an SM against 4). Whether that is faster is for the GPU to say; until timed it is off.
An E4M3 V tile is read as words as in the tile walk (``fp8_words.py``), which saves 3-6% more.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tessel.kernels.attention.fp8_words import load_e4m3_words
from tessel.kernels.attention.merge import (
    bucket_tiles,
    load_query_group,
    store_tile_output,
    tile_span,
)
from tessel.kernels.autotune import autotune_enabled
from tessel.kernels.specialization import step_varying

# (SPLIT = warps, BLOCK_N, stages); the first is the untuned default (also the interpreter's)
SHAPES = [(2, 16, 2), (4, 16, 4), (4, 16, 3), (4, 32, 3), (2, 16, 4), (2, 32, 4), (8, 16, 3)]


def tile_configs(tuned: bool) -> list[triton.Config]:
    """What the autotuner picks from: every shape, or the default alone."""
    return [triton.Config({"BLOCK_N": n, "SPLIT": s}, num_warps=s, num_stages=st)
            for s, n, st in (SHAPES if tuned else SHAPES[:1])]


@triton.autotune(configs=tile_configs(autotune_enabled()), key=["HEAD_DIM", "GROUP_PAD", "PAGE", "F16_DOTS"])
@triton.jit(do_not_specialize=step_varying("stride_bt", "num_tiles", "bucket_off", "first_off", "count_off"))
def decode_warps_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    block_tables_ptr, sched_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt,
    num_tiles, bucket_off, first_off, count_off, num_q_heads,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, PAGE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, KV_FP8: tl.constexpr = False,
    F16_DOTS: tl.constexpr = False, V_WORDS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """The arguments of ``decode._decode_kernel``, repeated: a Triton kernel's parameters cannot be
    shared, and ``paged_decode`` launches either kernel with the same call."""
    if PDL:  # see kernels/pdl.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    kvh = tl.program_id(1)
    t_lo, t_hi = bucket_tiles(sched_ptr, bucket_off)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_sn = tl.arange(0, SPLIT)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    k_base = k_ptr + kvh * stride_kh + offs_d[None, None, :]
    v_base = v_ptr + kvh * stride_vh + offs_d[None, None, :]
    if V_WORDS:  # see fp8_words.py
        v_words = (v_ptr.to(tl.pointer_type(tl.int32)) + kvh * (stride_vh // 4)
                   + tl.arange(0, HEAD_DIM // 4)[None, None, :])
    for t in range(t_lo, t_hi):
        req, start, end = tile_span(sched_ptr, t, num_tiles)
        q = load_query_group(q_ptr, k_ptr, req, heads, g_mask, offs_d, stride_qt, stride_qh, KV_FP8, F16_DOTS)
        qs = tl.broadcast_to(q[None, :, :], (SPLIT, GROUP_PAD, HEAD_DIM))
        # -1e30, not -inf: a warp whose chunk holds no valid token keeps alpha = 1 and p = 0
        m_i = tl.full([SPLIT, GROUP_PAD], -1e30, tl.float32)
        l_i = tl.zeros([SPLIT, GROUP_PAD], tl.float32)
        acc = tl.zeros([SPLIT, GROUP_PAD, HEAD_DIM], tl.float32)
        table = block_tables_ptr + req.to(tl.int64) * stride_bt
        for n0 in range(start, end, SPLIT * BLOCK_N):
            pos = n0 + offs_sn
            valid = pos < end
            blk = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
            off = pos % PAGE
            k = tl.load(k_base + (blk * stride_kb + off * stride_ks)[:, :, None], mask=valid[:, :, None], other=0.0)
            if V_WORDS:
                v = tl.reshape(load_e4m3_words(v_words + (blk * (stride_vb // 4) + off * (stride_vs // 4))[:, :, None],
                                               valid[:, :, None], SPLIT * BLOCK_N, HEAD_DIM, q.dtype),
                               (SPLIT, BLOCK_N, HEAD_DIM))
            else:
                v = tl.load(v_base + (blk * stride_vb + off * stride_vs)[:, :, None], mask=valid[:, :, None], other=0.0)
            if KV_FP8:
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            s = tl.dot(qs, tl.trans(k, (0, 2, 1)), input_precision=DOT_PRECISION)
            s = tl.where(valid[:, None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 2))
            p = tl.exp2(s - m_new[:, :, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 2)
            acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        m = tl.max(m_i, 0)
        w = tl.exp2(m_i - m[None, :])
        l_sum = tl.sum(l_i * w, 0)
        o = tl.sum(acc * w[:, :, None], 0)
        store_tile_output(o / l_sum[:, None], m + tl.log2(l_sum), req, t, heads, g_mask, offs_d, out_ptr,
                          part_out_ptr, part_lse_ptr, sched_ptr, count_off, stride_ot, stride_oh, num_q_heads, HEAD_DIM)
