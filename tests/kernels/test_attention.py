"""Paged attention kernels against ``reference.paged_attention``.

CPU cases run Triton's interpreter in fp32/fp16 on tiny shapes; the same cases run on CUDA in
bf16 (``-m gpu``). Lengths are ragged (1, exactly one block, not multiples of the tile or the
block), unused cache slots hold NaN, GQA ratios are 1, 4 and 8, head dims 64 and 128.
"""

from __future__ import annotations

import pytest
import torch

from tessel.kernels import reference
from tessel.kernels.attention.decode import DecodeConfig, build_decode_plan, paged_decode
from tessel.kernels.attention.paged import paged_attention
from tessel.kernels.attention.prefill import paged_prefill
from tests.kernels.factories import make_batch

# (num_q_heads, num_kv_heads, head_dim)
HEADS = [(2, 2, 64), (8, 2, 128), (8, 1, 64)]
DECODE_LENS = [1, 16, 37, 100, 5, 64]  # tile 32, block 16 on the CPU


def _dtype(device: str, cpu_dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if device == "cuda" else cpu_dtype


def _expected(q, k_cache, v_cache, md, scale):  # type: ignore[no-untyped-def]
    """The reference in fp32 on the CPU, from the same (rounded) inputs."""
    md_cpu = type(md)(**{**md.__dict__, "scratch": {}})
    for name in ("query_start_loc", "seq_lens", "block_tables", "slot_mapping"):
        setattr(md_cpu, name, getattr(md, name).cpu())
    return reference.paged_attention(q.float().cpu(), k_cache.float().cpu(), v_cache.float().cpu(), md_cpu, scale)


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-3, rtol=2e-3)}.get(
        dtype, dict(atol=2e-2, rtol=2e-2)
    )


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"q{h[0]}kv{h[1]}d{h[2]}")
@pytest.mark.parametrize("mode", ["balanced", "per-tile", "static", "none"])
def test_decode_matches_reference(device: str, heads: tuple[int, int, int], mode: str) -> None:
    hq, hkv, d = heads
    dtype = _dtype(device, torch.float32 if hq == hkv else torch.float16)
    lens = DECODE_LENS if device == "cpu" else [1, 16, 1000, 4099, 129, 7, 2048, 300]
    q, kc, vc, md = make_batch(lens, [1] * len(lens), num_q_heads=hq, num_kv_heads=hkv,
                               head_dim=d, block_size=16, dtype=dtype, device=device)
    tile = 32 if device == "cpu" else 128
    cfg = DecodeConfig(mode="balanced" if mode == "per-tile" else mode, tile_size=tile,  # type: ignore[arg-type]
                       num_splits=3, coalesce=mode != "per-tile")
    plan = build_decode_plan(md.seq_lens, hq, hkv, d, q.device, cfg)
    if mode in ("balanced", "per-tile"):
        assert plan.needs_merge and (plan.host.req_num_tiles == 1).any()  # both output paths run
    out = paged_decode(q, kc, vc, md.block_tables, plan, d**-0.5)
    torch.testing.assert_close(out.float().cpu(), _expected(q, kc, vc, md, d**-0.5), **_tol(dtype))


PREFILL_CASES = {
    # seq_lens, query_lens: plain prefill, chunked prefill / prefix hit, decode rows mixed in.
    "prefill": ([1, 16, 45], [1, 16, 45]),
    "extend": ([37, 80, 16], [5, 33, 16]),
    "mixed": ([70, 3, 33], [1, 3, 1]),
}


@pytest.mark.parametrize("pack_gqa", [False, True], ids=["per-head", "gqa-packed"])
@pytest.mark.parametrize("case", list(PREFILL_CASES))
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"q{h[0]}kv{h[1]}d{h[2]}")
def test_prefill_matches_reference(device: str, heads: tuple[int, int, int], case: str, pack_gqa: bool) -> None:
    hq, hkv, d = heads
    if device == "cpu" and (hq, case) == (8, "prefill") and hkv == 1:
        pytest.skip("covered by the other CPU cases; keeps the interpreter suite short")
    dtype = _dtype(device, torch.float32 if hq == hkv else torch.float16)
    seq_lens, q_lens = PREFILL_CASES[case]
    if device == "cuda":
        seq_lens, q_lens = [s * 9 + 1 for s in seq_lens], [q * 9 + 1 for q in q_lens]
    q, kc, vc, md = make_batch(seq_lens, q_lens, num_q_heads=hq, num_kv_heads=hkv,
                               head_dim=d, block_size=16, dtype=dtype, device=device)
    out = paged_prefill(q, kc, vc, md, d**-0.5, pack_gqa=pack_gqa)
    torch.testing.assert_close(out.float().cpu(), _expected(q, kc, vc, md, d**-0.5), **_tol(dtype))


@pytest.mark.parametrize("pack_gqa", [False, True], ids=["per-head", "gqa-packed"])
def test_prefill_rows_span_query_heads_of_odd_groups(device: str, pack_gqa: bool) -> None:
    """Packed, a block's rows are (token, query head) pairs: with 7 query heads per KV head
    (Qwen2's 14/2) a row block ends mid-token and a decode row's heads straddle blocks."""
    dtype = _dtype(device, torch.float32)
    q, kc, vc, md = make_batch([45, 1, 40, 51], [40, 1, 17, 2], num_q_heads=14, num_kv_heads=2,
                               head_dim=64, block_size=16, dtype=dtype, device=device)
    out = paged_prefill(q, kc, vc, md, 0.125, pack_gqa=pack_gqa)
    torch.testing.assert_close(out.float().cpu(), _expected(q, kc, vc, md, 0.125), **_tol(dtype))


def test_paged_attention_reuses_one_plan_per_step(device: str) -> None:
    q, kc, vc, md = make_batch([3, 40], [1, 1], num_q_heads=4, num_kv_heads=2, head_dim=64,
                               block_size=16, dtype=_dtype(device, torch.float32), device=device)
    first = paged_attention(q, kc, vc, md, 0.125)
    plans = [v for k, v in md.scratch.items() if isinstance(k, tuple) and k[0] == "decode_plan"]
    second = paged_attention(q, kc, vc, md, 0.125)
    assert len(plans) == 1 and len(md.scratch) == 2  # the plan and the int32 block table
    torch.testing.assert_close(first, second)
    torch.testing.assert_close(first.float().cpu(), _expected(q, kc, vc, md, 0.125), **_tol(q.dtype))


def test_decode_launcher_names_bad_arguments() -> None:
    q, kc, vc, md = make_batch([3], [1], num_q_heads=4, num_kv_heads=2, head_dim=64,
                               block_size=16, dtype=torch.float32)
    plan = build_decode_plan(md.seq_lens, 4, 2, 64, q.device)
    with pytest.raises(ValueError, match="v_cache"):
        paged_decode(q, kc, vc.half(), md.block_tables, plan, 0.125)
    with pytest.raises(ValueError, match="block_tables"):
        paged_decode(q, kc, vc, md.block_tables.long(), plan, 0.125)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_decode(q[:, :3], kc, vc, md.block_tables, plan, 0.125)


@pytest.mark.parametrize("counts", [[70, 1, 3], [33, 32, 2]], ids=["70-1-3", "33-32-2"])
def test_merge_combines_many_partials(device: str, counts: list[int]) -> None:
    """More partials than one merge iteration takes (32), beside single-tile requests that the
    merge must leave alone; against the log-sum-exp combination in float64."""
    import numpy as np

    from tessel.kernels.attention.merge import merge_partials

    hq, d, batch = 4, 64, len(counts)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    tiles = int(sum(counts))
    g = torch.Generator().manual_seed(1)
    part_out = torch.randn(tiles, hq, d, generator=g)
    part_lse = torch.randn(tiles, hq, generator=g) * 4
    sched = torch.tensor(np.concatenate([first, counts]), dtype=torch.int32)
    got = torch.full((batch, hq, d), 7.0, device=device)  # single-tile rows must stay untouched
    merge_partials(got, part_out.to(device), part_lse.to(device), sched.to(device), first_off=0, batch=batch)
    for r, (f, c) in enumerate(zip(first, counts, strict=True)):
        if c == 1:
            assert (got[r].cpu() == 7.0).all()
            continue
        w = torch.softmax(part_lse[f : f + c].double() * np.log(2), dim=0)  # lse is in log2 units
        expected = (w[..., None] * part_out[f : f + c].double()).sum(0)
        torch.testing.assert_close(got[r].cpu().double(), expected, atol=1e-5, rtol=1e-5)


def _head_major(cache: torch.Tensor) -> torch.Tensor:
    """The same [blocks, page, heads, D] values stored [blocks, heads, page, D] (TESSEL_KV_LAYOUT=hnd)."""
    return cache.transpose(1, 2).contiguous().transpose(1, 2)


def test_kernels_read_and_write_a_head_major_cache(device: str) -> None:
    """The kernels take the cache's strides: decode, prefill and the KV write give the same
    values over a head-major copy of the cache as over the token-major one."""
    from tessel.kernels.kv_store import store_kv

    dtype = _dtype(device, torch.float32)
    q, kc, vc, md = make_batch([37, 70, 16], [1, 1, 1], num_q_heads=8, num_kv_heads=2, head_dim=64,
                               block_size=16, dtype=dtype, device=device)
    plan = build_decode_plan(md.seq_lens, 8, 2, 64, q.device, DecodeConfig(tile_size=32))
    hk, hv = _head_major(kc), _head_major(vc)
    assert hk.shape == kc.shape and hk.stride(1) == 64
    torch.testing.assert_close(paged_decode(q, hk, hv, md.block_tables, plan, 0.125),
                               paged_decode(q, kc, vc, md.block_tables, plan, 0.125), equal_nan=True)
    q, kc, vc, md = make_batch([37, 80], [5, 33], num_q_heads=8, num_kv_heads=2, head_dim=64,
                               block_size=16, dtype=dtype, device=device)
    torch.testing.assert_close(paged_prefill(q, _head_major(kc), _head_major(vc), md, 0.125),
                               paged_prefill(q, kc, vc, md, 0.125))
    k, v = torch.randn(2, 3, 2, 64, device=device).to(dtype)
    slots = torch.tensor([5, 40, 17], device=device)
    hk, hv = _head_major(kc), _head_major(vc)
    store_kv(k, v, kc, vc, slots)
    store_kv(k, v, hk, hv, slots)
    torch.testing.assert_close(hk, kc, equal_nan=True)
    torch.testing.assert_close(hv, vc, equal_nan=True)
