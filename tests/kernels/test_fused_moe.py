"""Fused MoE (kernels/moe) against the loop-over-experts reference: Triton's interpreter on the
CPU, real kernels on CUDA (``-m gpu``). Skewed routings, empty experts holding NaN weights (a
kernel that reads them fails), decode-sized T, ragged H and I; plus the tile schedule's invariants."""

from __future__ import annotations

import pytest
import torch

from tessel.kernels import dispatch
from tessel.kernels.moe import align, triton_moe
from tessel.kernels.moe import reference as ref
from tessel.kernels.moe.configs import MoeConfig
from tests.kernels.conftest import HAS_CUDA

# (name, T, H, I, E, K): H and I not all multiples of the interpreter's 16-wide tiles.
CASES = [
    ("decode", 1, 32, 16, 8, 2),
    ("uniform", 8, 32, 24, 4, 2),
    ("one_expert", 33, 32, 16, 4, 1),
    ("empty_experts", 17, 40, 48, 8, 2),
    ("prefill", 64, 32, 40, 6, 2),  # several tiles per expert
]


def _routing(name: str, tokens: int, experts: int, top_k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k weights (fp32, as route_topk gives) and ids [T, K] for one routing pattern."""
    logits = torch.randn(tokens, experts, generator=g)
    if name == "one_expert":
        logits[:, 2] += 100.0  # every token's first choice
    if name == "empty_experts":
        logits[:, [1, 2, 4, 6, 7]] -= 100.0  # only experts 0, 3, 5 ever chosen
    return ref.route_topk(logits, top_k, renormalise=True)


def _problem(name: str, t: int, h: int, i: int, e: int, k: int, dtype: torch.dtype, device: str, seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, i, generator=g) / i**0.5
    weights, ids = _routing(name, t, e, k, g)
    unused = torch.ones(e, dtype=torch.bool)
    unused[ids.unique()] = False
    w13[unused], w2[unused] = float("nan"), float("nan")
    cast = dict(device=device, dtype=dtype)
    return x.to(**cast), w13.to(**cast), w2.to(**cast), weights.to(device), ids.to(device)


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-3, rtol=2e-3)}.get(
        dtype, dict(atol=3e-2, rtol=3e-2)
    )


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fused_moe_matches_reference(device: str, case: tuple[str, int, int, int, int, int]) -> None:
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    x, w13, w2, weights, ids = _problem(*case, dtype=dtype, device=device)
    got = triton_moe.fused_moe(x, w13, w2, weights, ids)
    want = ref.fused_moe(x.float(), w13.float(), w2.float(), weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), want, **_tol(dtype))
    assert torch.equal(got, triton_moe.fused_moe(x, w13, w2, weights, ids))  # no atomics: bit-stable


@pytest.mark.parametrize("tokens", [1, 2, 5])
@pytest.mark.parametrize("routing", ["uniform", "one_expert", "empty_experts"])
def test_gemv_and_grouped_paths_agree(device: str, tokens: int, routing: str) -> None:
    """The few-token GEMV path and the tile-grouped path, forced each way, against the reference
    (one_expert: pairs of different tokens share an expert; ragged H and I; NaN unused experts)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    x, w13, w2, weights, ids = _problem(routing, tokens, 40, 24, 8, 2, dtype=dtype, device=device, seed=tokens)
    want = ref.fused_moe(x.float(), w13.float(), w2.float(), weights, ids)
    gemv = triton_moe.fused_moe(x, w13, w2, weights, ids, gemv=True)
    grouped = triton_moe.fused_moe(x, w13, w2, weights, ids, gemv=False)
    assert gemv.dtype == dtype and gemv.shape == x.shape
    torch.testing.assert_close(gemv.float(), want, **_tol(dtype))
    torch.testing.assert_close(grouped.float(), want, **_tol(dtype))
    assert torch.equal(gemv, triton_moe.fused_moe(x, w13, w2, weights, ids, gemv=True))  # bit-stable


def test_gemv_path_is_taken_only_for_few_pairs() -> None:
    from tessel.kernels.moe.triton_moe_gemv import use_gemv

    assert use_gemv(1, 8, 128) and use_gemv(4, 8, 128) and not use_gemv(5, 8, 128)
    assert use_gemv(1, 2, 8) and not use_gemv(2, 2, 8)  # Mixtral: batch 1 only


def test_fused_moe_fp16_and_tall_tiles(device: str) -> None:
    """fp16 inputs with fp32 accumulation; int32 ids; a 32-row tile config (more padding per expert)."""
    x, w13, w2, weights, ids = _problem("uniform", 9, 32, 24, 4, 2, dtype=torch.float16, device=device)
    ids = ids.int()
    got = triton_moe.fused_moe(x, w13, w2, weights, ids, config=MoeConfig(32, 16, 16, 1, 1))
    want = ref.fused_moe(x.float(), w13.float(), w2.float(), weights, ids)
    torch.testing.assert_close(got.float(), want, **_tol(torch.float16))


def test_fused_moe_names_bad_arguments() -> None:
    x, w13, w2, weights, ids = _problem("uniform", 4, 32, 16, 4, 2, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="w2"):
        triton_moe.fused_moe(x, w13, w2[:, :, :8], weights, ids)
    with pytest.raises(ValueError, match="w13 has dtype"):
        triton_moe.fused_moe(x, w13.half(), w2, weights, ids)
    with pytest.raises(ValueError, match="w13 must stack"):
        triton_moe.fused_moe(x, w13[:, :31], w2, weights, ids)
    with pytest.raises(ValueError, match="topk_weights"):
        triton_moe.fused_moe(x, w13, w2, weights[:, :1], ids)


@pytest.mark.parametrize("block_m", [1, 4, 16])
@pytest.mark.parametrize("routing", ["uniform", "one_expert", "empty_experts"])
def test_align_pairs_groups_every_pair_once(block_m: int, routing: str) -> None:
    tokens, experts, top_k = 37, 8, 2
    _, ids = _routing(routing, tokens, experts, top_k, torch.Generator().manual_seed(3))
    tiles = align.align_pairs(ids, experts, block_m)
    n = tokens * top_k
    counts = torch.bincount(ids.reshape(-1), minlength=experts)
    want_tiles = int(((counts + block_m - 1) // block_m).sum())
    used = int(tiles.num_tiles.item())
    assert used == want_tiles <= align.max_tiles(n, experts, block_m) == tiles.tile_expert.numel()
    rows = tiles.sorted_pairs.view(-1, block_m)
    valid = rows < n
    assert torch.equal(rows[valid].sort().values, torch.arange(n, dtype=torch.int32))  # each pair once
    assert not valid[used:].any() and bool((tiles.tile_expert[used:] == -1).all())
    assert int((~valid[:used]).sum()) == used * block_m - n  # padding counted, nothing else
    flat = ids.reshape(-1)
    for tile in range(used):
        expert = int(tiles.tile_expert[tile])
        assert bool((flat[rows[tile][valid[tile]].long()] == expert).all())  # one expert per tile
        assert bool(valid[tile, 0])  # padding only at a segment's end: no all-padding tile
    expert_of_tile = tiles.tile_expert[:used]
    assert torch.equal(expert_of_tile, expert_of_tile.sort().values)  # segments in expert order
    assert set(expert_of_tile.tolist()) == set(flat.unique().tolist())  # empty experts get no tile


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 40, 300])
def test_fused_moe_bf16_qwen3_moe_shape(tokens: int) -> None:
    """Qwen3-30B-A3B's expert shape (H 2048, I 768, top-8) with 32 experts, through dispatch."""
    hidden, inter, experts, top_k = 2048, 768, 32, 8  # T=1: the GEMV path; 40, 300: grouped tiles
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    w13 = (torch.randn(experts, 2 * inter, hidden, device="cuda", generator=g) / hidden**0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, inter, device="cuda", generator=g) / inter**0.5).bfloat16()
    weights, ids = ref.route_topk(torch.randn(tokens, experts, device="cuda", generator=g), top_k, True)
    got = dispatch.fused_moe(x, w13, w2, weights, ids)
    want = ref.fused_moe(x.float(), w13.float(), w2.float(), weights, ids)
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
