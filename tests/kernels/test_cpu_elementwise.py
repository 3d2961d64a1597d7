"""The CPU engine's C elementwise kernels (``cpu_elementwise.c``) against the torch references,
and the wrapper's contract: fall back to the reference for what C does not take, ValueError for
shapes that cannot be right."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from tessel.kernels import cpu_elementwise, dispatch, reference

TOL: dict[str, Any] = dict(atol=1e-5, rtol=1e-5)
NORM_SHAPES = [(1, 576), (7, 577), (32, 576), (300, 1001), (3, 9, 64), (5, 3), (2048, 576)]
SILU_WIDTHS = [(1, 1536), (4, 7), (33, 13), (32, 1536), (700, 1536)]
ROPE_HEADS = [(9, 3, 64), (8, 1, 128), (4, 4, 10), (2, 2, 6)]  # 10, 6: half-widths not multiples of 8


class _Spy:
    """Stands in for the reference module inside cpu_elementwise: counts fallbacks, or refuses
    them so that a test of the C path cannot silently pass on the reference."""

    def __init__(self, allow: bool) -> None:
        self.allow, self.calls = allow, 0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if not self.allow:
                raise AssertionError(f"cpu_elementwise fell back to reference.{name}")
            self.calls += 1
            return getattr(reference, name)(*args)
        return call


@pytest.fixture(autouse=True)
def _fresh_kernels() -> Iterator[None]:
    """kernels() reads TESSEL_CPU_KERNELS once per process; tests here change it."""
    cpu_elementwise.kernels.cache_clear()
    yield
    cpu_elementwise.kernels.cache_clear()


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSEL_CPU_KERNELS", "native")
    if cpu_elementwise.kernels() is None:
        pytest.skip("no C compiler: the native kernels are not built here")
    monkeypatch.setattr(cpu_elementwise, "reference", _Spy(allow=False))


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> _Spy:
    s = _Spy(allow=True)
    monkeypatch.setattr(cpu_elementwise, "reference", s)
    return s


def _randn(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e4], ids=["unit", "large"])
def test_rms_norm_matches_reference(native: None, shape: tuple[int, ...], scale: float) -> None:
    x, w = _randn(*shape, scale=scale), _randn(shape[-1], seed=1)
    torch.testing.assert_close(cpu_elementwise.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **TOL)


@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e4], ids=["unit", "large"])
def test_fused_add_rms_norm_matches_reference(native: None, shape: tuple[int, ...], scale: float) -> None:
    x, res, w = _randn(*shape, scale=scale), _randn(*shape, seed=2, scale=scale), _randn(shape[-1], seed=1)
    x0, res0 = x.clone(), res.clone()
    out, new_res = cpu_elementwise.fused_add_rms_norm(x, res, w, 1e-5)
    want_out, want_res = reference.fused_add_rms_norm(x, res, w, 1e-5)
    torch.testing.assert_close(new_res, want_res, atol=0, rtol=0)  # one fp32 add, as torch does it
    torch.testing.assert_close(out, want_out, **TOL)
    assert torch.equal(x, x0) and torch.equal(res, res0)  # out of place, like the reference


@pytest.mark.parametrize("rows_width", SILU_WIDTHS, ids=str)
@pytest.mark.parametrize("scale", [1.0, 40.0], ids=["unit", "large"])  # 40: exp(-g) overflows for some
def test_silu_and_mul_matches_reference(native: None, rows_width: tuple[int, int], scale: float) -> None:
    rows, d = rows_width
    x = _randn(rows, 2 * d, scale=scale)
    out = cpu_elementwise.silu_and_mul(x)
    assert out.shape == (rows, d) and not out.isnan().any()
    torch.testing.assert_close(out, reference.silu_and_mul(x), **TOL)


def _qkv_views(tokens: int, hq: int, hkv: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as the engine has them: views into one fused qkv row per token."""
    qkv = _randn(tokens, (hq + 2 * hkv) * d, seed=seed)
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.reshape(tokens, hq, d), k.reshape(tokens, hkv, d)


@pytest.mark.parametrize("heads", ROPE_HEADS, ids=lambda h: f"q{h[0]}kv{h[1]}d{h[2]}")
@pytest.mark.parametrize("tokens", [1, 37, 600])
def test_per_head_rms_norm_of_qkv_views(native: None, heads: tuple[int, int, int], tokens: int) -> None:
    """Qwen3's q/k norms: x is [T, H, D] strided into the fused qkv rows, normed per head."""
    hq, hkv, d = heads
    q, k = _qkv_views(tokens, hq, hkv, d, seed=tokens)
    w = _randn(d, seed=1)
    for x in (q, k):
        assert not x.is_contiguous() or x.shape[0] == 1
        torch.testing.assert_close(cpu_elementwise.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **TOL)


@pytest.mark.parametrize("heads", ROPE_HEADS, ids=lambda h: f"q{h[0]}kv{h[1]}d{h[2]}")
@pytest.mark.parametrize("tokens", [1, 4, 37, 600])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32], ids=str)
def test_rope_matches_reference(native: None, heads: tuple[int, int, int], tokens: int, pos_dtype: torch.dtype) -> None:
    hq, hkv, d = heads
    q, k = _qkv_views(tokens, hq, hkv, d, seed=tokens)
    cache = _randn(1000, d, seed=5)
    positions = torch.randint(0, 1000, (tokens,), generator=torch.Generator().manual_seed(6)).to(pos_dtype)
    q_out, k_out = cpu_elementwise.apply_rope(q, k, positions, cache)
    want_q, want_k = reference.apply_rope(q, k, positions, cache)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    torch.testing.assert_close(q_out, want_q, **TOL)
    torch.testing.assert_close(k_out, want_k, **TOL)


def test_dispatch_takes_the_c_path_on_cpu_fp32(native: None) -> None:
    x, w = _randn(4, 576), _randn(576, seed=1)
    torch.testing.assert_close(dispatch.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **TOL)
    torch.testing.assert_close(dispatch.silu_and_mul(x), reference.silu_and_mul(x), **TOL)


def test_native_kernels_off_fall_back(spy: _Spy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSEL_CPU_KERNELS", "torch")
    assert cpu_elementwise.kernels() is None
    x, w = _randn(3, 64), _randn(64, seed=1)
    q, k = _qkv_views(3, 2, 1, 64, seed=0)
    assert torch.equal(cpu_elementwise.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
    cpu_elementwise.fused_add_rms_norm(x, x, w, 1e-6)
    cpu_elementwise.silu_and_mul(x)
    cpu_elementwise.apply_rope(q, k, torch.arange(3), _randn(8, 64))
    assert spy.calls == 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=str)
def test_other_dtypes_and_layouts_fall_back(spy: _Spy, dtype: torch.dtype) -> None:
    x, w = _randn(5, 64).to(dtype), _randn(64, seed=1).to(dtype)
    torch.testing.assert_close(cpu_elementwise.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), atol=0, rtol=0)
    torch.testing.assert_close(cpu_elementwise.silu_and_mul(x), reference.silu_and_mul(x), atol=0, rtol=0)
    strided = _randn(64, 5).t()  # fp32 but not contiguous
    cpu_elementwise.rms_norm(strided, _randn(64), 1e-6)
    q = _randn(2, 64, 4).transpose(1, 2)  # heads not packed within a token
    cpu_elementwise.apply_rope(q, q, torch.arange(2), _randn(4, 64))
    assert spy.calls == 4


def test_bad_shapes_raise_value_error() -> None:
    x = _randn(3, 64)
    with pytest.raises(ValueError, match="weight"):
        cpu_elementwise.rms_norm(x, _randn(63), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        cpu_elementwise.fused_add_rms_norm(x, _randn(3, 32), _randn(64), 1e-6)
    with pytest.raises(ValueError, match="even"):
        cpu_elementwise.silu_and_mul(_randn(3, 7))
    q, k = _qkv_views(3, 2, 1, 64, seed=0)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        cpu_elementwise.apply_rope(q, k, torch.arange(3), _randn(8, 32))
    with pytest.raises(ValueError, match="positions"):
        cpu_elementwise.apply_rope(q, k, torch.arange(3.0), _randn(8, 64))


def test_position_outside_the_cache_raises(native: None) -> None:
    q, k = _qkv_views(3, 2, 1, 64, seed=0)
    with pytest.raises(ValueError, match="positions"):
        cpu_elementwise.apply_rope(q, k, torch.tensor([0, 8, 1]), _randn(8, 64))
