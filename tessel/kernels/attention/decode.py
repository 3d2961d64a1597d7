"""Split-KV paged decode attention: the balanced tile walk, its static and no-split twins.

One program per (bucket, KV head) walks its bucket's tiles (``plan.py``). Each tile loads the
whole GQA group of query heads once ([G, D] in shared memory), streams its K/V blocks through
the block table with software pipelining, keeps scores in registers and an online softmax,
then either writes the output (the request's only tile) or a partial output and its
log-sum-exp for ``merge.py``. An E4M3 cache (``KV_FP8``) is widened to the query's dtype as it
is loaded: decode is bound by reading the cache, which is then half the bytes of bf16. Its V
tile is read as 32-bit words (``fp8_words.py``; ``TESSEL_FP8_V_WORDS=0`` reads bytes), and
``TESSEL_FP8_F16=1`` runs the dots in fp16 (opt-in: faster alone, not in the engine; see
``benchmarks/results/fp8_kv_decode_h100.md``). A walk with each warp on its own tokens was
tried and removed: slower at short contexts (``benchmarks/results/decode_warps_h100.md``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tessel.kernels import pdl
from tessel.kernels.attention.decode_plan import (  # re-exported: the plan's public names
    DEFAULT_DECODE,
    DecodeConfig,
    DecodePlan,
    StaticDecodePlan,
    build_decode_plan,
    decode_plan_for,
    decode_plan_key,
)
from tessel.kernels.attention.fp8_words import can_read_words, load_e4m3_words
from tessel.kernels.attention.merge import (
    bucket_tiles,
    load_query_group,
    merge_partials,
    store_tile_output,
    tile_span,
)
from tessel.kernels.autotune import autotune_enabled
from tessel.kernels.checks import FLOAT_DTYPES, KV_CACHE_DTYPES, check_shape, check_tensor
from tessel.kernels.specialization import step_varying

__all__ = [
    "DEFAULT_DECODE", "DecodeConfig", "DecodePlan", "StaticDecodePlan", "build_decode_plan",
    "decode_plan_for", "decode_plan_key", "paged_decode",
]

LOG2E = 1.4426950408889634


def _decode_configs() -> list[triton.Config]:
    # The first entry is the untuned default (also the interpreter's).
    shapes = [(64, 4, 3)]
    if autotune_enabled():
        shapes += [(64, 4, 4), (64, 4, 5), (128, 4, 3), (128, 8, 3), (32, 4, 4), (32, 4, 6), (64, 8, 4),
                   (64, 4, 6), (128, 8, 4), (32, 8, 6)]
    return [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s) for n, w, s in shapes]


@triton.autotune(configs=_decode_configs(), key=["HEAD_DIM", "GROUP_PAD", "PAGE", "F16_DOTS", "V_WORDS"])
@triton.jit(do_not_specialize=step_varying("stride_bt", "num_tiles", "bucket_off", "first_off", "count_off"))
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    block_tables_ptr, sched_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt,
    num_tiles, bucket_off, first_off, count_off, num_q_heads,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, PAGE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, KV_FP8: tl.constexpr = False,
    F16_DOTS: tl.constexpr = False, V_WORDS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    if PDL:  # see kernels/pdl.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    kvh = tl.program_id(1)
    t_lo, t_hi = bucket_tiles(sched_ptr, bucket_off)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    k_base = k_ptr + kvh * stride_kh + offs_d[None, :]
    v_base = v_ptr + kvh * stride_vh + offs_d[None, :]
    if V_WORDS:  # see fp8_words.py
        v_words = v_ptr.to(tl.pointer_type(tl.int32)) + kvh * (stride_vh // 4) + tl.arange(0, HEAD_DIM // 4)[None, :]
    for t in range(t_lo, t_hi):
        req, start, end = tile_span(sched_ptr, t, num_tiles)
        q = load_query_group(q_ptr, k_ptr, req, heads, g_mask, offs_d, stride_qt, stride_qh, KV_FP8, F16_DOTS)
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        table = block_tables_ptr + req.to(tl.int64) * stride_bt
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + offs_n
            valid = pos < end
            blk = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
            off = pos % PAGE
            k = tl.load(k_base + (blk * stride_kb + off * stride_ks)[:, None], mask=valid[:, None], other=0.0)
            if V_WORDS:
                v = load_e4m3_words(v_words + (blk * (stride_vb // 4) + off * (stride_vs // 4))[:, None],
                                    valid[:, None], BLOCK_N, HEAD_DIM, q.dtype)
            else:
                v = tl.load(v_base + (blk * stride_vb + off * stride_vs)[:, None], mask=valid[:, None], other=0.0)
            if KV_FP8:
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        store_tile_output(acc / l_i[:, None], m_i + tl.log2(l_i), req, t, heads, g_mask, offs_d, out_ptr,
                          part_out_ptr, part_lse_ptr, sched_ptr, count_off, stride_ot, stride_oh, num_q_heads, HEAD_DIM)


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    plan: DecodePlan,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request: q [B, Hq, D] over the paged cache -> [B, Hq, D]."""
    _check_decode_args(q, k_cache, v_cache, block_tables, plan)
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    c, bucket_off, first_off, count_off = plan.offsets
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    grid = (plan.grid_buckets, num_kv_heads)
    _decode_kernel[grid](
        q, k_cache, v_cache, out, plan.part_out, plan.part_lse, block_tables, plan.sched,
        scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        c, bucket_off, first_off, count_off, num_q_heads,
        HEAD_DIM=head_dim, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        PAGE=page, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        KV_FP8=fp8, F16_DOTS=fp8 and q.dtype == torch.bfloat16 and os.environ.get("TESSEL_FP8_F16") == "1",
        V_WORDS=fp8 and os.environ.get("TESSEL_FP8_V_WORDS", "1") != "0" and can_read_words(v_cache),
        **pdl.launch_options(q),
    )
    if plan.needs_merge:
        merge_partials(out, plan.part_out, plan.part_lse, plan.sched, first_off=first_off, batch=batch)
    return out


def _check_decode_args(q, k_cache, v_cache, block_tables, plan) -> None:  # type: ignore[no-untyped-def]
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, ndim=4, dtypes=KV_CACHE_DTYPES, device=q.device)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,), device=q.device)
    check_shape("v_cache", v_cache, k_cache.shape)
    check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32,), device=q.device)
    batch, num_q_heads, head_dim = q.shape
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache head_dim {k_cache.shape[3]} != q head_dim {head_dim}")
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    if num_q_heads % k_cache.shape[2]:
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of KV heads ({k_cache.shape[2]})")
    if block_tables.shape[0] != batch or plan.host.req_num_tiles.shape[0] != batch:
        raise ValueError(f"block_tables rows ({block_tables.shape[0]}) and the plan must match batch {batch}")
