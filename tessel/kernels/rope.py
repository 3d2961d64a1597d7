"""Neox-style rotary embedding of q and k from a ``[max_pos, D]`` cos | sin cache, optionally
fused with the KV write (the rotated k and the new v go straight into their cache slots).

Llama-3 frequency scaling is already baked into the cache contents. One program per token
rotates all its q and k heads, so cos/sin are read once per token. Fusing the KV write saves a
launch per layer: at decode sizes a launch costs 1-3 µs of GPU time on an H200 whatever little it
does (``benchmarks/results/decode_h200.md``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels import pdl
from tessel.kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    KV_CACHE_DTYPES,
    check_shape,
    check_tensor,
)


@triton.jit
def _rotate_heads(x_ptr, o_ptr, tok, stride_xt, stride_xh, stride_ot, stride_oh, n_heads, cos, sin,
                  HALF: tl.constexpr, HEADS_PAD: tl.constexpr):
    """Rotate a token's heads into ``o_ptr``; returns the two rotated halves (output dtype)."""
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HALF)
    mask = offs_h[:, None] < n_heads
    src = x_ptr + tok * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = o_ptr + tok * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    dtype = o_ptr.dtype.element_ty
    y1 = (x1 * cos - x2 * sin).to(dtype)
    y2 = (x2 * cos + x1 * sin).to(dtype)
    tl.store(dst, y1, mask=mask)
    tl.store(dst + HALF, y2, mask=mask)
    return y1, y2


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cache_ptr,
    v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_c, n_q_heads, n_kv_heads,
    stride_vt, stride_vh, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    HALF: tl.constexpr, Q_PAD: tl.constexpr, K_PAD: tl.constexpr,
    STORE_KV: tl.constexpr, PAGE: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # see kernels/pdl.py
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_d = tl.arange(0, HALF)
    cos = tl.load(cache_ptr + pos * stride_c + offs_d).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * stride_c + HALF + offs_d).to(tl.float32)[None, :]
    _rotate_heads(q_ptr, qo_ptr, tok, stride_qt, stride_qh, stride_qot, stride_qoh, n_q_heads, cos, sin, HALF, Q_PAD)
    k1, k2 = _rotate_heads(k_ptr, ko_ptr, tok, stride_kt, stride_kh, stride_kot, stride_koh, n_kv_heads, cos, sin,
                           HALF, K_PAD)
    if STORE_KV:
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot >= 0:  # -1: a padding row, which owns no slot
            offs_h = tl.arange(0, K_PAD)[:, None]
            mask = offs_h < n_kv_heads
            blk, off = slot // PAGE, slot % PAGE
            kc = kc_ptr + blk * stride_kcb + off * stride_kcs + offs_h * stride_kch + offs_d[None, :]
            tl.store(kc, k1.to(kc_ptr.dtype.element_ty), mask=mask)
            tl.store(kc + HALF, k2.to(kc_ptr.dtype.element_ty), mask=mask)
            src = v_ptr + tok * stride_vt + offs_h * stride_vh + offs_d[None, :]
            vc = vc_ptr + blk * stride_vcb + off * stride_vcs + offs_h * stride_vch + offs_d[None, :]
            tl.store(vc, tl.load(src, mask=mask).to(vc_ptr.dtype.element_ty), mask=mask)
            tl.store(vc + HALF, tl.load(src + HALF, mask=mask).to(vc_ptr.dtype.element_ty), mask=mask)


def _check_rope_args(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> int:
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES, device=q.device)
    check_tensor("positions", positions, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES, device=q.device)
    tokens, _, head_dim = q.shape
    check_shape("k", k, (tokens, None, head_dim))
    check_shape("positions", positions, (tokens,))
    check_shape("cos_sin_cache", cos_sin_cache, (None, head_dim))
    half = head_dim // 2
    if head_dim % 2 or half & (half - 1):
        raise ValueError(f"head_dim must be twice a power of two, got {head_dim}")
    return half


def _launch(q, k, positions, cos_sin_cache, kv):  # type: ignore[no-untyped-def]
    half = _check_rope_args(q, k, positions, cos_sin_cache)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    tokens = q.shape[0]
    if not tokens:
        return q_out, k_out
    if kv is None:  # no KV write: the extra pointers are never read
        v, k_cache, v_cache, slots = k, k, k, positions
        cache_strides, page = (0,) * 6, 1
    else:
        v, k_cache, v_cache, slots = kv
        cache_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
        page = k_cache.shape[1]
    _rope_kernel[(tokens,)](
        q, k, q_out, k_out, positions, cos_sin_cache,
        v, k_cache, v_cache, slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos_sin_cache.stride(0), q.shape[1], k.shape[1],
        v.stride(0), v.stride(1), *cache_strides,
        HALF=half, Q_PAD=triton.next_power_of_2(q.shape[1]), K_PAD=triton.next_power_of_2(k.shape[1]),
        STORE_KV=kv is not None, PAGE=page, **pdl.launch_options(q),
    )
    return q_out, k_out


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hkv, D], positions: [T] -> rotated (q, k), new tensors."""
    return _launch(q, k, positions, cos_sin_cache, None)


def apply_rope_and_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rope`` then ``store_kv`` of the rotated k and of v into ``kv_cache`` = (K, V), in one launch."""
    k_cache, v_cache = kv_cache
    check_tensor("v", v, ndim=3, dtypes=FLOAT_DTYPES, device=q.device)
    check_shape("v", v, k.shape)
    check_tensor("k_cache", k_cache, ndim=4, dtypes=KV_CACHE_DTYPES, device=q.device)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,), device=q.device)
    check_shape("k_cache", k_cache, (None, None, k.shape[1], k.shape[2]))
    check_shape("v_cache", v_cache, k_cache.shape)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    check_shape("slot_mapping", slot_mapping, (q.shape[0],))
    return _launch(q, k, positions, cos_sin_cache, (v, k_cache, v_cache, slot_mapping))
