"""The decode schedule's device side: which tiles a program walks, the query heads they serve,
where a tile's output goes, and the merge of a request's partial outputs by their log-sum-exp
(split-KV reduce)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels import pdl
from tessel.kernels.specialization import step_varying


@triton.jit
def bucket_tiles(sched_ptr, bucket_off):
    """The range of tiles program ``program_id(0)`` walks (its bucket in the schedule table)."""
    bucket = tl.program_id(0)
    return tl.load(sched_ptr + bucket_off + bucket), tl.load(sched_ptr + bucket_off + bucket + 1)


@triton.jit
def tile_span(sched_ptr, t, num_tiles):
    """Tile ``t``: its request and the [start, end) of that request's tokens it covers."""
    return tl.load(sched_ptr + t), tl.load(sched_ptr + num_tiles + t), tl.load(sched_ptr + 2 * num_tiles + t)


@triton.jit
def load_query_group(q_ptr, k_ptr, req, heads, g_mask, offs_d, stride_qt, stride_qh,
                     KV_FP8: tl.constexpr, F16_DOTS: tl.constexpr):
    """A request's query heads of one KV head, [G, D], in the dots' dtype: the cache's, or the
    query's own over an E4M3 cache (widened to it), or fp16 (clamped to its range) with F16_DOTS."""
    q = tl.load(q_ptr + req * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=g_mask[:, None], other=0.0)
    if not KV_FP8:
        q = q.to(k_ptr.dtype.element_ty)
    elif F16_DOTS:
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    return q


@triton.jit
def store_tile_output(acc, lse, req, t, heads, g_mask, offs_d, out_ptr, part_out_ptr, part_lse_ptr, sched_ptr,
                      count_off, stride_ot, stride_oh, num_q_heads, HEAD_DIM: tl.constexpr):
    """A decode tile's normalised output ``acc`` [G, D] for its query heads: the request's output
    when the tile is its only one, else a partial (and its log2-sum-exp ``lse``) for the merge."""
    if tl.load(sched_ptr + count_off + req) == 1:
        o_ptr = out_ptr + req * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptr, acc.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        row = t * num_q_heads + heads  # int32 is enough below 2**31 / (Hq * D) tiles
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_lse_ptr + row, lse, mask=g_mask)


@triton.jit(do_not_specialize=step_varying("first_off", "count_off"))
def _merge_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, sched_ptr,
    stride_ot, stride_oh, first_off, count_off, num_q_heads,
    HEAD_DIM: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # see kernels/pdl.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    req = tl.program_id(0)
    head = tl.program_id(1)
    count = tl.load(sched_ptr + count_off + req)
    if count > 1:  # single-tile requests were written by the decode kernel
        first = tl.load(sched_ptr + first_off + req)
        offs_d = tl.arange(0, HEAD_DIM)
        row = first * num_q_heads + head
        m = tl.load(part_lse_ptr + row)
        acc = tl.load(part_out_ptr + row * HEAD_DIM + offs_d)
        l_sum = m * 0.0 + 1.0
        for i in range(first + 1, first + count):
            row = i * num_q_heads + head
            lse = tl.load(part_lse_ptr + row)
            o = tl.load(part_out_ptr + row * HEAD_DIM + offs_d)
            m_new = tl.maximum(m, lse)
            a = tl.exp2(m - m_new)
            b = tl.exp2(lse - m_new)
            acc = acc * a + o * b
            l_sum = l_sum * a + b
            m = m_new
        o_ptr = out_ptr + req * stride_ot + head * stride_oh + offs_d
        tl.store(o_ptr, (acc / l_sum).to(out_ptr.dtype.element_ty))


def merge_partials(
    out: torch.Tensor,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    sched: torch.Tensor,
    *,
    first_off: int,
    batch: int,
) -> None:
    """out[r, h] = softmax-weighted sum of request r's tile partials (lse in log2 units)."""
    if part_out.dtype != torch.float32 or part_lse.dtype != torch.float32:
        raise ValueError("part_out and part_lse must be float32")
    if part_out.shape[:2] != part_lse.shape or part_out.shape[2] != out.shape[2]:
        raise ValueError(f"partials {tuple(part_out.shape)} / {tuple(part_lse.shape)} do not match out {tuple(out.shape)}")
    num_q_heads, head_dim = out.shape[1], out.shape[2]
    _merge_kernel[(batch, num_q_heads)](
        out, part_out, part_lse, sched, out.stride(0), out.stride(1),
        first_off, first_off + batch, num_q_heads, HEAD_DIM=head_dim, num_warps=1, **pdl.launch_options(out),
    )
