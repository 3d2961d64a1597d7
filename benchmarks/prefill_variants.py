"""The paged prefill kernel with each change of 2026-12-06 behind a switch, for
``benchmarks/prefill_attention.py``: all switches off is the kernel before that date (commit
6f8a852), and each switch alone, or each one left out, attributes the difference. Same arguments
and layout as ``tessel.kernels.attention.prefill`` (GQA-packed rows).

A copy on purpose, not an import of the kernel's pieces: the baseline must stay the kernel as it was,
whatever later changes make of ``prefill.py``, or the benchmark's "before" column would drift with it.

- ORDER 0: row blocks fastest on the grid, first to last (before); 1: row blocks fastest, last
  (most keys) first, heads slowest; 2: heads fastest, row blocks last-first.
- ACC_IN_DOT: the rescaled accumulator is the PV dot's addend, not a separate add.
- FMA_SCALE: the softmax scale rides on the row max and one FMA per score.
- UNMASKED: no masks on the loads of the blocks every row sees in full.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.attention.prefill import LOG2E, _device_metadata

BEFORE = dict(ORDER=0, ACC_IN_DOT=False, FMA_SCALE=False, UNMASKED=False)
BEFORE_CONFIGS = [(128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 4), (128, 128, 8, 2)]


@triton.jit
def _attend_block(
    acc, l_i, m_i, q, q_pos, n0, kv_end, table, k_base, v_base,
    stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, offs_n,
    PAGE: tl.constexpr, CAUSAL: tl.constexpr, ACC_IN_DOT: tl.constexpr, FMA_SCALE: tl.constexpr,
    UNMASKED: tl.constexpr,
):
    pos = n0 + offs_n
    off = pos % PAGE
    if UNMASKED and not CAUSAL:
        blk = tl.load(table + pos // PAGE).to(tl.int64)
        k = tl.load(k_base + (blk * stride_kb + off * stride_ks)[:, None])
        v = tl.load(v_base + (blk * stride_vb + off * stride_vs)[:, None])
    else:
        valid = pos < kv_end
        blk = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
        k = tl.load(k_base + (blk * stride_kb + off * stride_ks)[:, None], mask=valid[:, None], other=0.0)
        v = tl.load(v_base + (blk * stride_vb + off * stride_vs)[:, None], mask=valid[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k))
    if CAUSAL:
        s = tl.where((pos[None, :] < kv_end) & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
    if FMA_SCALE:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
    else:
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if ACC_IN_DOT:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def _variant_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, qsl_ptr, seq_lens_ptr, block_tables_ptr, qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, ROWS: tl.constexpr,
    ORDER: tl.constexpr, ACC_IN_DOT: tl.constexpr, FMA_SCALE: tl.constexpr, UNMASKED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    if ORDER == 0:
        pid_m, req, kvh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    elif ORDER == 1:
        pid_m, req, kvh = tl.num_programs(0) - 1 - tl.program_id(0), tl.program_id(1), tl.program_id(2)
    else:
        kvh, pid_m, req = tl.program_id(0), tl.num_programs(1) - 1 - tl.program_id(1), tl.program_id(2)
    first_head = kvh * ROWS
    q_start = tl.load(qsl_ptr + req)
    q_len = tl.load(qsl_ptr + req + 1) - q_start
    if pid_m * BLOCK_M < q_len * ROWS:
        seq_len = tl.load(seq_lens_ptr + req)
        ctx = seq_len - q_len
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        m_valid = offs_m < q_len * ROWS
        tok = offs_m // ROWS
        rows = (q_start + tok).to(tl.int64)
        heads = first_head + offs_m % ROWS
        q = tl.load(q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=m_valid[:, None], other=0.0)
        q_pos = ctx + tok
        table = block_tables_ptr + req.to(tl.int64) * stride_bt
        k_base = k_ptr + kvh * stride_kh + offs_d[None, :]
        v_base = v_ptr + kvh * stride_vh + offs_d[None, :]
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        full_end = (ctx + pid_m * BLOCK_M // ROWS) // BLOCK_N * BLOCK_N
        for n0 in range(0, full_end, BLOCK_N):
            acc, l_i, m_i = _attend_block(
                acc, l_i, m_i, q, q_pos, n0, full_end, table, k_base, v_base,
                stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, offs_n,
                PAGE, False, ACC_IN_DOT, FMA_SCALE, UNMASKED)
        kv_end = tl.minimum(seq_len, ctx + ((pid_m + 1) * BLOCK_M - 1) // ROWS + 1)
        for n0 in range(full_end, kv_end, BLOCK_N):
            acc, l_i, m_i = _attend_block(
                acc, l_i, m_i, q, q_pos, n0, kv_end, table, k_base, v_base,
                stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, offs_n,
                PAGE, True, ACC_IN_DOT, FMA_SCALE, UNMASKED)
        acc = acc / l_i[:, None]
        o_ptr = out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptr, acc.to(out_ptr.dtype.element_ty), mask=m_valid[:, None])


_before_kernel = triton.autotune(
    configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in BEFORE_CONFIGS],
    key=["HEAD_DIM", "PAGE", "ROWS"],
)(_variant_kernel)


def variant_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, md: AttentionMetadata, scale: float,
    out: torch.Tensor, config: tuple[int, int, int, int] | None = None, **switches: object,
) -> torch.Tensor:
    """``switches`` as in ``BEFORE``; ``config`` (BLOCK_M, BLOCK_N, warps, stages), or None to
    autotune over the configs of the kernel before (only with the ``BEFORE`` switches)."""
    rows, kv_heads, head_dim = q.shape[1] // k_cache.shape[2], k_cache.shape[2], q.shape[2]
    qsl, seq_lens, tables = _device_metadata(md, q.device)
    sw = {**BEFORE, **switches}

    def grid(meta):  # type: ignore[no-untyped-def]
        m_blocks = triton.cdiv(md.max_query_len * rows, meta["BLOCK_M"])
        return (kv_heads, m_blocks, md.batch_size) if sw["ORDER"] == 2 else (m_blocks, md.batch_size, kv_heads)

    args = (q, k_cache, v_cache, out, qsl, seq_lens, tables, scale * LOG2E,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), tables.stride(0))
    if config is None:
        assert sw == BEFORE, "autotuning is for the kernel before only"
        _before_kernel[grid](*args, HEAD_DIM=head_dim, PAGE=k_cache.shape[1], ROWS=rows, **sw)
    else:
        bm, bn, w, s = config
        _variant_kernel[grid](*args, HEAD_DIM=head_dim, PAGE=k_cache.shape[1], ROWS=rows, **sw,
                              BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
    return out
