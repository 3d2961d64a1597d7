"""Prefill / extend attention over the paged cache (FlashAttention-2 style online softmax).

Covers full prefill, chunked prefill and prefix-cache hits in one kernel: request ``b``'s
new queries are the last ``q_len`` of its ``seq_len`` positions, and they attend causally to
everything before them in the cache (``store_kv`` has written the new tokens' K/V already).
Grid: (heads, row blocks, requests); programs past a request's rows exit. A block's rows are one
query head's tokens, or with ``pack_gqa`` the (token, query head) pairs of one KV head,
token-major: then the GROUP query heads that share a KV head read its keys and values once, and
a decode row in a mixed step (one token, GROUP rows) costs one pass over its context per KV head
rather than one per query head. Packed is the default: on an H200 it is 2.0-3.1x faster on
mixed decode + prefill steps and equal on prefill alone (``benchmarks/attention_mixed.py``,
``benchmarks/results/attention_mixed_h200.md``); ``TESSEL_PREFILL_PACK_GQA=0`` turns it off.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.autotune import autotune_enabled
from tessel.kernels.checks import FLOAT_DTYPES, KV_CACHE_DTYPES, check_shape, check_tensor
from tessel.kernels.specialization import step_varying

LOG2E = 1.4426950408889634


def _prefill_configs() -> list[triton.Config]:
    shapes = [(64, 32, 4, 2)]  # the untuned default (and the interpreter's)
    if autotune_enabled():
        shapes = [(128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 4), (128, 128, 8, 2),
                  (128, 128, 8, 3), (128, 64, 8, 4), (64, 128, 4, 3)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in shapes]


@triton.jit
def _attend_block(
    acc, l_i, m_i, q, q_pos, n0, kv_end, table, k_base, v_base,
    stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, offs_n,
    PAGE: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
):
    pos = n0 + offs_n
    off = pos % PAGE
    if CAUSAL:
        valid = pos < kv_end
        blk = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
        k = tl.load(k_base + (blk * stride_kb + off * stride_ks)[:, None], mask=valid[:, None], other=0.0)
        v = tl.load(v_base + (blk * stride_vb + off * stride_vs)[:, None], mask=valid[:, None], other=0.0)
    else:  # every key of the block is cached and seen by every row: no masks needed
        blk = tl.load(table + pos // PAGE).to(tl.int64)
        k = tl.load(k_base + (blk * stride_kb + off * stride_ks)[:, None])
        v = tl.load(v_base + (blk * stride_vb + off * stride_vs)[:, None])
    if KV_FP8:  # an E4M3 cache, widened to the query's dtype
        k = k.to(q.dtype)
        v = v.to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if CAUSAL:
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
    # The scale rides on the row max and on one FMA per score rather than a multiply of its own.
    # m_new is finite from the first block on: the loops run in key order and key 0 is visible
    # to every row (padded rows too), so no -inf - -inf guard is needed.
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    # The rescaled accumulator is the PV dot's addend: the tensor cores accumulate in place.
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, l_i, m_new


PACK_GQA_BY_DEFAULT = os.environ.get("TESSEL_PREFILL_PACK_GQA", "1") == "1"


@triton.autotune(configs=_prefill_configs(), key=["HEAD_DIM", "GROUP", "PAGE", "ROWS"])
@triton.jit(do_not_specialize=step_varying("stride_bt"))
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, qsl_ptr, seq_lens_ptr, block_tables_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KV_FP8: tl.constexpr = False,
):
    # ROWS rows per token: 1 (program pid_h is a query head) or GROUP (pid_h is a KV head and
    # the rows are its query heads' (token, head) pairs). Heads vary fastest and row blocks run
    # last-first: the GPU starts the blocks with the most keys first, so the short ones fill
    # the last wave instead of the long ones leaving most SMs idle at the end.
    pid_h = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    req = tl.program_id(2)
    kvh = pid_h // (GROUP // ROWS)
    first_head = pid_h * ROWS
    q_start = tl.load(qsl_ptr + req)
    q_len = tl.load(qsl_ptr + req + 1) - q_start
    if pid_m * BLOCK_M < q_len * ROWS:
        seq_len = tl.load(seq_lens_ptr + req)
        ctx = seq_len - q_len  # cached prefix before the first new token
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        m_valid = offs_m < q_len * ROWS
        tok = offs_m // ROWS
        rows = (q_start + tok).to(tl.int64)
        heads = first_head + offs_m % ROWS
        q = tl.load(q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=m_valid[:, None], other=0.0)
        if not KV_FP8:
            q = q.to(k_ptr.dtype.element_ty)
        q_pos = ctx + tok
        table = block_tables_ptr + req.to(tl.int64) * stride_bt
        k_base = k_ptr + kvh * stride_kh + offs_d[None, :]
        v_base = v_ptr + kvh * stride_vh + offs_d[None, :]
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        # Keys every query row of the block sees: no mask needed.
        full_end = (ctx + pid_m * BLOCK_M // ROWS) // BLOCK_N * BLOCK_N
        for n0 in range(0, full_end, BLOCK_N):
            acc, l_i, m_i = _attend_block(
                acc, l_i, m_i, q, q_pos, n0, full_end, table, k_base, v_base,
                stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, offs_n,
                PAGE=PAGE, CAUSAL=False, DOT_PRECISION=DOT_PRECISION, KV_FP8=KV_FP8)
        # The diagonal: keys up to the block's last query position.
        kv_end = tl.minimum(seq_len, ctx + ((pid_m + 1) * BLOCK_M - 1) // ROWS + 1)
        for n0 in range(full_end, kv_end, BLOCK_N):
            acc, l_i, m_i = _attend_block(
                acc, l_i, m_i, q, q_pos, n0, kv_end, table, k_base, v_base,
                stride_kb, stride_ks, stride_vb, stride_vs, qk_scale, offs_n,
                PAGE=PAGE, CAUSAL=True, DOT_PRECISION=DOT_PRECISION, KV_FP8=KV_FP8)
        acc = acc / l_i[:, None]
        o_ptr = out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptr, acc.to(out_ptr.dtype.element_ty), mask=m_valid[:, None])


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,
    pack_gqa: bool | None = None,
) -> torch.Tensor:
    """Causal attention of every new token over its request's paged context: [T, Hq, D].
    ``pack_gqa``: the row layout (see the module's docstring); None takes the default."""
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, ndim=4, dtypes=KV_CACHE_DTYPES, device=q.device)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,), device=q.device)
    check_shape("v_cache", v_cache, k_cache.shape)
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    if k_cache.shape[3] != head_dim or head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16 equal in q and cache, got {head_dim}/{k_cache.shape[3]}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of KV heads ({num_kv_heads})")
    qsl, seq_lens, tables = _device_metadata(md, q.device)
    check_shape("query_start_loc", qsl, (md.batch_size + 1,))
    check_shape("block_tables", tables, (md.batch_size, None))
    if out is None:
        out = torch.empty_like(q)
    group = num_q_heads // num_kv_heads
    pack = PACK_GQA_BY_DEFAULT if pack_gqa is None else pack_gqa
    rows, heads = (group, num_kv_heads) if pack else (1, num_q_heads)
    grid = lambda meta: (heads, triton.cdiv(md.max_query_len * rows, meta["BLOCK_M"]), md.batch_size)  # noqa: E731
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, qsl, seq_lens, tables, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), tables.stride(0),
        HEAD_DIM=head_dim, GROUP=group, PAGE=page, ROWS=rows,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", KV_FP8=k_cache.dtype == torch.float8_e4m3fn,
    )
    return out


def _device_metadata(md: AttentionMetadata, device: torch.device) -> tuple[torch.Tensor, ...]:
    """int32 copies of the step's index tensors on the device, made once per step."""
    cached = md.scratch.get("prefill_metadata")
    if cached is None:
        cached = md.scratch["prefill_metadata"] = tuple(
            t.to(device, torch.int32) for t in (md.query_start_loc, md.seq_lens, md.block_tables)
        )
    return cached  # type: ignore[no-any-return]
