"""The CPU engine's fast paths against the references: paged attention (the C decode kernel
and the torch fallback), and oneDNN-packed linear layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tessel.kernels import cpu_attention, cpu_linear, cpu_native, dispatch, reference
from tessel.kernels.attention.metadata import AttentionMetadata
from tests.kernels.factories import make_batch

HEADS = [(2, 2, 64), (8, 2, 128), (8, 1, 64), (9, 3, 64)]
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(params=["native", "torch"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native" and cpu_native.decode_kernel() is None:
        pytest.skip("no C compiler: the native kernel is not built here")
    if request.param == "torch":
        monkeypatch.setattr(cpu_attention, "_native_fits", lambda q, k: False)
    return str(request.param)


def _fresh(md: AttentionMetadata) -> AttentionMetadata:
    return AttentionMetadata(**{**md.__dict__, "scratch": {}})


def _new_kv(cache: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
    """The K (or V) rows of each request's new tokens, read from where they sit in the cache."""
    qsl, lens, bs = md.query_start_loc.tolist(), md.seq_lens.tolist(), md.block_size
    rows = []
    for b, s_len in enumerate(lens):
        for pos in range(s_len - (qsl[b + 1] - qsl[b]), s_len):
            rows.append(cache[md.block_tables[b, pos // bs], pos % bs])
    return torch.stack(rows)


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"q{h[0]}kv{h[1]}d{h[2]}")
def test_decode_matches_reference(decode_path: str, heads: tuple[int, int, int]) -> None:
    hq, hkv, d = heads
    lens = [1, 16, 37, 100, 5, 64, 300, 17, 33, 250] * 4  # ragged; 40 rows: two torch groups
    q, kc, vc, md = make_batch(lens, [1] * len(lens), num_q_heads=hq, num_kv_heads=hkv,
                               head_dim=d, block_size=16, dtype=torch.float32)
    out = cpu_attention.paged_attention(q, kc, vc, _fresh(md), d**-0.5)
    assert not out.isnan().any()  # the caches' unused slots are NaN
    torch.testing.assert_close(out, reference.paged_attention(q, kc, vc, _fresh(md), d**-0.5), **TOL)


@pytest.mark.parametrize("heads", HEADS[:3], ids=lambda h: f"q{h[0]}kv{h[1]}d{h[2]}")
@pytest.mark.parametrize("pass_new_kv", [True, False], ids=["new-kv", "cache-only"])
def test_mixed_batch_matches_reference(decode_path: str, heads: tuple[int, int, int], pass_new_kv: bool) -> None:
    """Decodes, whole prompts (no prefix) and chunks on a cached prefix in one step."""
    hq, hkv, d = heads
    seq_lens, query_lens = [40, 1, 77, 16, 129, 3], [40, 1, 20, 1, 129, 2]
    q, kc, vc, md = make_batch(seq_lens, query_lens, num_q_heads=hq, num_kv_heads=hkv,
                               head_dim=d, block_size=16, dtype=torch.float32, seed=3)
    k_new, v_new = (_new_kv(kc, md), _new_kv(vc, md)) if pass_new_kv else (None, None)
    out = cpu_attention.paged_attention(q, kc, vc, _fresh(md), d**-0.5, k_new, v_new)
    torch.testing.assert_close(out, reference.paged_attention(q, kc, vc, _fresh(md), d**-0.5), **TOL)


def test_native_kernel_rejects_what_it_cannot_take() -> None:
    if cpu_native.decode_kernel() is None:
        pytest.skip("no C compiler: the native kernel is not built here")
    q, kc, vc, md = make_batch([5], [1], num_q_heads=2, num_kv_heads=2, head_dim=64,
                               block_size=16, dtype=torch.float32)
    lens = md.seq_lens.long()
    with pytest.raises(ValueError, match="block_tables"):
        cpu_native.paged_decode(q, kc, vc, md.block_tables, lens, 0.1)  # int32 tables
    with pytest.raises(ValueError, match="q must be"):
        cpu_native.paged_decode(q.half(), kc, vc, md.block_tables.long(), lens, 0.1)


@pytest.mark.parametrize("shape", [(7, 64, 96), (1, 576, 960), (33, 128, 40), (300, 64, 24)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(shape: tuple[int, int, int], bias: bool) -> None:
    m, k, n = shape
    x, w = torch.randn(m, k), torch.randn(n, k)
    b = torch.randn(n) if bias else None
    packed = cpu_linear.pack(w)
    if packed is None:
        pytest.skip("this torch build has no oneDNN")
    expected = F.linear(x, w, b)
    torch.testing.assert_close(dispatch.linear(x, w, b, packed), expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(dispatch.linear(x.view(1, m, k), w, b, packed), expected.view(1, m, n), atol=1e-4, rtol=1e-5)


def test_packed_linear_bounds_the_shapes_onednn_sees() -> None:
    """Row counts pad to buckets (each new shape is a cached primitive of ~1 MiB), so a server's
    ever-changing step sizes compile a bounded set; the padding never shows in the output."""
    buckets = {cpu_linear.row_bucket(m) for m in range(1, cpu_linear.PACKED_MAX_ROWS + 1)}
    assert len(buckets) <= 32 and all(cpu_linear.row_bucket(m) >= m for m in range(1, 300))
    x, w = torch.randn(17, 32), torch.randn(8, 32)
    packed = cpu_linear.pack(w)
    if packed is None:
        pytest.skip("this torch build has no oneDNN")
    got = dispatch.linear(x, w, None, packed)
    assert got.shape == (17, 8) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, w), atol=1e-4, rtol=1e-5)


def test_packing_skips_what_onednn_path_does_not_cover() -> None:
    assert cpu_linear.pack(torch.randn(8, 8, dtype=torch.bfloat16)) is None
    x, w = torch.randn(3, 8), torch.randn(4, 8)
    torch.testing.assert_close(dispatch.linear(x, w, None, None), F.linear(x, w))



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_argmax_rows_matches_torch(dtype: torch.dtype) -> None:
    """The numpy path against torch.argmax: random rows, rows of ties, -inf masks, a strided view."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 5003, generator=g, dtype=dtype)
    x[3] = 2.0  # all tied: the first index
    x[4, ::2] = float("-inf")
    x[5, [7, 4000]] = 1e6  # two tied maxima
    for view in (x, x[:, 1:], x[::3]):
        got = dispatch.argmax_rows(view)
        assert got.dtype == torch.int64 and torch.equal(got, view.argmax(dim=-1))
