"""Neox-style rotary embedding of q and k from a ``[max_pos, D]`` cos | sin cache.

Llama-3 frequency scaling is already baked into the cache contents. One program per token
rotates all its q and k heads, so cos/sin are read once per token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels.checks import FLOAT_DTYPES, INDEX_DTYPES, check_shape, check_tensor


@triton.jit
def _rotate_heads(x_ptr, o_ptr, tok, stride_xt, stride_xh, stride_ot, stride_oh, n_heads, cos, sin,
                  HALF: tl.constexpr, HEADS_PAD: tl.constexpr):
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HALF)
    mask = offs_h[:, None] < n_heads
    src = x_ptr + tok * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = o_ptr + tok * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    dtype = o_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(dtype), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_c, n_q_heads, n_kv_heads,
    HALF: tl.constexpr, Q_PAD: tl.constexpr, K_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_d = tl.arange(0, HALF)
    cos = tl.load(cache_ptr + pos * stride_c + offs_d).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * stride_c + HALF + offs_d).to(tl.float32)[None, :]
    _rotate_heads(q_ptr, qo_ptr, tok, stride_qt, stride_qh, stride_qot, stride_qoh, n_q_heads, cos, sin, HALF, Q_PAD)
    _rotate_heads(k_ptr, ko_ptr, tok, stride_kt, stride_kh, stride_kot, stride_koh, n_kv_heads, cos, sin, HALF, K_PAD)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hkv, D], positions: [T] -> rotated (q, k), new tensors."""
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
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if tokens:
        _rope_kernel[(tokens,)](
            q, k, q_out, k_out, positions, cos_sin_cache,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            cos_sin_cache.stride(0), q.shape[1], k.shape[1],
            HALF=half, Q_PAD=triton.next_power_of_2(q.shape[1]), K_PAD=triton.next_power_of_2(k.shape[1]),
        )
    return q_out, k_out
