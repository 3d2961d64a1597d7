"""RMSNorm (+ residual), SiLU-and-mul, RoPE and the KV write against their references."""

from __future__ import annotations

import pytest
import torch

from tessel.kernels import reference
from tessel.kernels.activation import silu_and_mul
from tessel.kernels.kv_store import store_kv
from tessel.kernels.norm import fused_add_rms_norm, rms_norm
from tessel.kernels.rope import apply_rope, apply_rope_and_store_kv


def _dtypes(device: str) -> list[torch.dtype]:
    return [torch.bfloat16] if device == "cuda" else [torch.float32, torch.float16]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}.get(
        dtype, dict(atol=2e-2, rtol=2e-2)
    )


def _randn(*shape: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.randn(*shape).to(device=device, dtype=dtype)


@pytest.mark.parametrize("hidden", [64, 200])
def test_rms_norm(device: str, hidden: int) -> None:
    for dtype in _dtypes(device):
        x = _randn(7, hidden, dtype=dtype, device=device)
        w = _randn(hidden, dtype=dtype, device=device)
        torch.testing.assert_close(rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **_tol(dtype))


def test_fused_add_rms_norm(device: str) -> None:
    for dtype in _dtypes(device):
        x, res = (_randn(3, 5, 96, dtype=dtype, device=device) for _ in range(2))
        w = _randn(96, dtype=dtype, device=device)
        res_before = res.clone()
        normed, new_res = fused_add_rms_norm(x, res, w, 1e-5)
        ref_normed, ref_res = reference.fused_add_rms_norm(x, res, w, 1e-5)
        torch.testing.assert_close(new_res, ref_res, **_tol(dtype))
        torch.testing.assert_close(normed, ref_normed, **_tol(dtype))
        assert torch.equal(res, res_before)  # same contract as the reference: inputs untouched


@pytest.mark.parametrize("d", [64, 300])
def test_silu_and_mul(device: str, d: int) -> None:
    for dtype in _dtypes(device):
        x = _randn(2, 3, 2 * d, dtype=dtype, device=device)
        torch.testing.assert_close(silu_and_mul(x), reference.silu_and_mul(x), **_tol(dtype))


@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_apply_rope(device: str, heads: tuple[int, int], head_dim: int) -> None:
    hq, hkv = heads
    inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(64).float(), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)
    positions = torch.tensor([0, 5, 63, 17, 1], device=device)
    for dtype in _dtypes(device):
        q = _randn(5, hq, head_dim, dtype=dtype, device=device)
        k = _randn(5, hkv, head_dim, dtype=dtype, device=device)
        got_q, got_k = apply_rope(q, k, positions, cache)
        ref_q, ref_k = reference.apply_rope(q, k, positions, cache)
        torch.testing.assert_close(got_q, ref_q, **_tol(dtype))
        torch.testing.assert_close(got_k, ref_k, **_tol(dtype))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_store_kv(device: str, head_dim: int) -> None:
    for dtype in _dtypes(device):
        shape = (5, 16, 2, head_dim)
        caches = [torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in range(4)]
        k, v = (_randn(6, 2, head_dim, dtype=torch.float32, device=device) for _ in range(2))
        slots = torch.tensor([0, 17, -1, 79, 40, 15], device=device)
        store_kv(k, v, caches[0], caches[1], slots)
        reference.store_kv(k, v, caches[2], caches[3], slots)
        torch.testing.assert_close(caches[0], caches[2], equal_nan=True)
        torch.testing.assert_close(caches[1], caches[3], equal_nan=True)


@pytest.mark.parametrize("heads", [(4, 4), (8, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_apply_rope_and_store_kv(device: str, heads: tuple[int, int], head_dim: int) -> None:
    """The fused launch equals apply_rope then store_kv: rotated q, rotated k, and the cache
    holding the rotated k and v at each slot (padding slot -1 writes nothing: NaN stays)."""
    hq, hkv = heads
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(100).float(), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)
    positions = torch.tensor([0, 99, 3, 17, 1, 64], device=device)
    slots = torch.tensor([0, 17, -1, 79, 40, 15], device=device)
    for dtype in _dtypes(device):
        # q/k/v as strided views of one fused projection, as the model hands them over
        qkv = _randn(6, (hq + 2 * hkv) * head_dim, dtype=dtype, device=device)
        q, k, v = (t.reshape(6, -1, head_dim) for t in qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], -1))
        caches = [torch.full((5, 16, hkv, head_dim), float("nan"), dtype=dtype, device=device) for _ in range(4)]
        got_q, got_k = apply_rope_and_store_kv(q, k, v, positions, cache, (caches[0], caches[1]), slots)
        ref_q, ref_k = reference.apply_rope(q, k, positions, cache)
        reference.store_kv(ref_k, v, caches[2], caches[3], slots)
        torch.testing.assert_close(got_q, ref_q, **_tol(dtype))
        torch.testing.assert_close(got_k, ref_k, **_tol(dtype))
        torch.testing.assert_close(caches[0], caches[2], equal_nan=True, **_tol(dtype))
        torch.testing.assert_close(caches[1], caches[3], equal_nan=True, **_tol(dtype))
        assert caches[0].isnan().sum() == caches[0].numel() - 5 * hkv * head_dim  # five real slots written


def test_launchers_name_bad_arguments() -> None:
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.randn(32), 1e-6)
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.randn(2, 5))
    with pytest.raises(ValueError, match="positions"):
        apply_rope(torch.randn(3, 2, 64), torch.randn(3, 2, 64), torch.zeros(3), torch.randn(8, 64))
    with pytest.raises(ValueError, match="slot_mapping"):
        cache = torch.zeros(2, 16, 2, 64)
        store_kv(torch.randn(3, 2, 64), torch.randn(3, 2, 64), cache, cache.clone(), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="v_cache"):
        cache = torch.zeros(2, 16, 2, 64)
        apply_rope_and_store_kv(torch.randn(3, 2, 64), torch.randn(3, 2, 64), torch.randn(3, 2, 64), torch.arange(3),
                                torch.randn(8, 64), (cache, torch.zeros(2, 16, 1, 64)), torch.zeros(3, dtype=torch.long))
