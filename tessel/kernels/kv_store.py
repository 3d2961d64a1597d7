"""Write each new token's K and V into its paged-cache slot (slot -1 = padding, skipped).

An E4M3 cache takes the values as they are (scale 1.0), saturated at +-448 by the conversion."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    KV_CACHE_DTYPES,
    check_shape,
    check_tensor,
)


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    n_heads,
    PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:
        blk = slot // PAGE
        off = slot % PAGE
        offs_h = tl.arange(0, HEADS_PAD)[:, None]
        offs_d = tl.arange(0, HEAD_DIM)[None, :]
        mask = offs_h < n_heads
        k = tl.load(k_ptr + tok * stride_kt + offs_h * stride_kh + offs_d, mask=mask)
        v = tl.load(v_ptr + tok * stride_vt + offs_h * stride_vh + offs_d, mask=mask)
        kc = kc_ptr + blk * stride_kcb + off * stride_kcs + offs_h * stride_kch + offs_d
        vc = vc_ptr + blk * stride_vcb + off * stride_vcs + offs_h * stride_vch + offs_d
        tl.store(kc, k.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc, v.to(vc_ptr.dtype.element_ty), mask=mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v: [T, Hkv, D] into caches [num_blocks, block_size, Hkv, D] at ``slot_mapping`` [T]."""
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("v", v, ndim=3, dtypes=FLOAT_DTYPES, device=k.device)
    check_tensor("k_cache", k_cache, ndim=4, dtypes=KV_CACHE_DTYPES, device=k.device)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,), device=k.device)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, device=k.device)
    tokens, heads, head_dim = k.shape
    check_shape("v", v, k.shape)
    check_shape("k_cache", k_cache, (None, None, heads, head_dim))
    check_shape("v_cache", v_cache, k_cache.shape)
    check_shape("slot_mapping", slot_mapping, (tokens,))
    if head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
    if tokens:
        _store_kv_kernel[(tokens,)](
            k, v, k_cache, v_cache, slot_mapping,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            heads, PAGE=k_cache.shape[1], HEAD_DIM=head_dim, HEADS_PAD=triton.next_power_of_2(heads),
        )
