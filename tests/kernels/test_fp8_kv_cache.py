"""An E4M3 KV cache (``kv_cache_dtype=fp8``): the KV write and both attention kernels against
their references.

Triton's interpreter converts fp32 -> e4m3 wrongly where rounding crosses a binade (1.97 -> 1.0
instead of 2.0) and where it saturates, so on the CPU the values written are ones E4M3 holds
exactly; rounding and saturation are checked on CUDA (``-m gpu``), where the conversion is the
hardware's.
"""

from __future__ import annotations

import pytest
import torch

from tessel.kernels import reference
from tessel.kernels.attention.decode import DecodeConfig, build_decode_plan, paged_decode
from tessel.kernels.attention.fp8_words import can_read_words
from tessel.kernels.attention.prefill import paged_prefill
from tessel.kernels.kv_store import store_kv
from tessel.kernels.rope import apply_rope_and_store_kv
from tests.kernels.factories import make_batch

FP8 = torch.float8_e4m3fn


def _kv(tokens: int, heads: int, head_dim: int, device: str) -> torch.Tensor:
    x = torch.randn(tokens, heads, head_dim) * 4
    if device == "cpu":
        return x.to(FP8).float()  # exactly representable: see the module's docstring
    x[0, 0, :3] = torch.tensor([1000.0, -900.0, 447.0])  # past E4M3's 448: saturated
    return x.to(device=device, dtype=torch.bfloat16)


def _nan_caches(n: int, shape: tuple[int, ...], device: str) -> list[torch.Tensor]:
    return [torch.full(shape, float("nan"), device=device).to(FP8) for _ in range(n)]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_store_kv_rounds_and_saturates_like_the_reference(device: str, head_dim: int) -> None:
    caches = _nan_caches(4, (5, 16, 2, head_dim), device)
    k, v = _kv(6, 2, head_dim, device), _kv(6, 2, head_dim, device)
    slots = torch.tensor([0, 17, -1, 79, 40, 15], device=device)
    store_kv(k, v, caches[0], caches[1], slots)
    reference.store_kv(k, v, caches[2], caches[3], slots)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        # bit-equal, NaN (the unwritten slots) included
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    written = caches[0][0, 0, 0, :3].float().cpu()
    if device == "cuda":
        assert written.tolist() == [448.0, -448.0, 448.0]
    assert caches[0].float().isnan().sum() == caches[0].numel() - 5 * 2 * head_dim


@pytest.mark.parametrize("heads", [(4, 4), (8, 1)])
def test_apply_rope_and_store_kv_into_fp8(device: str, heads: tuple[int, int]) -> None:
    if device == "cpu":
        pytest.skip("rotated keys are rounded to e4m3, which the interpreter gets wrong at binade edges")
    hq, hkv, head_dim = *heads, 128
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(100).float(), inv)
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)
    positions = torch.tensor([0, 99, 3, 17, 1, 64], device=device)
    slots = torch.tensor([0, 17, -1, 79, 40, 15], device=device)
    q = torch.randn(6, hq, head_dim, device=device, dtype=torch.bfloat16)
    k, v = _kv(6, hkv, head_dim, device), _kv(6, hkv, head_dim, device)
    caches = _nan_caches(4, (5, 16, hkv, head_dim), device)
    _, got_k = apply_rope_and_store_kv(q, k, v, positions, cos_sin, (caches[0], caches[1]), slots)
    reference.store_kv(got_k, v, caches[2], caches[3], slots)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def _fp8_batch(device: str, seq_lens: list[int], query_lens: list[int], heads: tuple[int, int, int]):  # type: ignore[no-untyped-def]
    hq, hkv, d = heads
    q, kc, vc, md = make_batch(seq_lens, query_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                               block_size=16, dtype=torch.float32, device=device)
    q = q.to(torch.bfloat16) if device == "cuda" else q
    return q, (kc * 4).to(FP8), (vc * 4).to(FP8), md


def _expected(q, k_cache, v_cache, md, scale):  # type: ignore[no-untyped-def]
    """The reference in fp32 on the CPU over the cache's values widened exactly."""
    md_cpu = type(md)(**{**md.__dict__, "scratch": {}})
    for name in ("query_start_loc", "seq_lens", "block_tables", "slot_mapping"):
        setattr(md_cpu, name, getattr(md, name).cpu())
    return reference.paged_attention(q.float().cpu(), k_cache.cpu(), v_cache.cpu(), md_cpu, scale)


def _tol(q: torch.Tensor) -> dict[str, float]:
    return dict(atol=1e-4, rtol=1e-4) if q.dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


# which switches each variant turns on (TESSEL_FP8_F16 takes a bf16 query, so acts on CUDA only)
DECODE_VARIANTS = {"v-words": ("TESSEL_FP8_V_WORDS",), "v-words-f16-dots": ("TESSEL_FP8_V_WORDS", "TESSEL_FP8_F16"),
                   "v-bytes": (), "v-bytes-f16-dots": ("TESSEL_FP8_F16",)}


@pytest.mark.parametrize("heads", [(2, 2, 64), (8, 2, 128)], ids=lambda h: f"q{h[0]}kv{h[1]}d{h[2]}")
@pytest.mark.parametrize("mode", ["balanced", "none"])
@pytest.mark.parametrize("kernel", list(DECODE_VARIANTS))
def test_decode_reads_an_fp8_cache(device: str, heads: tuple[int, int, int], mode: str, kernel: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for switch in ("TESSEL_FP8_F16", "TESSEL_FP8_V_WORDS"):
        monkeypatch.setenv(switch, "1" if switch in DECODE_VARIANTS[kernel] else "0")
    hq, hkv, d = heads
    lens = [1, 16, 37, 100, 5] if device == "cpu" else [1, 16, 1000, 4099, 129, 7]
    q, kc, vc, md = _fp8_batch(device, lens, [1] * len(lens), heads)
    cfg = DecodeConfig(mode=mode, tile_size=32 if device == "cpu" else 128, num_splits=3)  # type: ignore[arg-type]
    plan = build_decode_plan(md.seq_lens, hq, hkv, d, q.device, cfg)
    out = paged_decode(q, kc, vc, md.block_tables, plan, d**-0.5)
    assert out.dtype == q.dtype
    torch.testing.assert_close(out.float().cpu(), _expected(q, kc, vc, md, d**-0.5), **_tol(q))


@pytest.mark.parametrize("pack_gqa", [False, True], ids=["per-head", "gqa-packed"])
def test_prefill_reads_an_fp8_cache(device: str, pack_gqa: bool) -> None:
    heads = (8, 2, 64)
    q, kc, vc, md = _fp8_batch(device, [37, 80, 16, 3], [5, 33, 16, 1], heads)
    out = paged_prefill(q, kc, vc, md, 0.125, pack_gqa=pack_gqa)
    assert out.dtype == q.dtype
    torch.testing.assert_close(out.float().cpu(), _expected(q, kc, vc, md, 0.125), **_tol(q))


def test_reference_and_cpu_paths_agree_on_an_fp8_cache() -> None:
    """The CPU engine's attention (kernels/cpu_attention.py) over an E4M3 cache equals the
    reference's, decode and prefill rows mixed."""
    from tessel.kernels import cpu_attention

    q, kc, vc, md = _fp8_batch("cpu", [37, 80, 16, 3], [5, 1, 16, 1], (8, 2, 64))
    got = cpu_attention.paged_attention(q, kc, vc, md, 0.125)
    torch.testing.assert_close(got, _expected(q, kc, vc, md, 0.125), atol=1e-5, rtol=1e-5)


def test_words_need_4_byte_aligned_rows() -> None:
    """decode reads V as words only where every row starts on a 4-byte boundary (else as bytes)."""
    flat = torch.zeros(2 * 16 * 2 * 64 + 2, dtype=torch.uint8).view(FP8)
    assert can_read_words(flat[: 2 * 16 * 2 * 64].view(2, 16, 2, 64))
    assert not can_read_words(flat[2:].view(2, 16, 2, 64))  # starts 2 bytes in
    assert not can_read_words(torch.zeros(2, 16, 2, 66, dtype=torch.uint8).view(FP8)[..., :64])  # 66-byte rows
