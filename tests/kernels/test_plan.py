"""Decode tile planner: exact coverage of every token, and balance within the issue's bound."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessel.kernels.attention.plan import TilePlan, default_num_buckets, plan_decode_tiles


def assert_covers_exactly(plan: TilePlan, lens: np.ndarray, tile_size: int | None) -> None:
    """Every token of every request in exactly one tile; tiles contiguous per request."""
    assert plan.bucket_ptr[0] == 0 and plan.bucket_ptr[-1] == plan.num_tiles
    assert (np.diff(plan.bucket_ptr) >= 0).all()
    assert (plan.tile_end > plan.tile_start).all()
    if tile_size is not None:
        assert (plan.tile_end - plan.tile_start <= tile_size).all()
    for r, length in enumerate(lens):
        first, n = plan.req_first_tile[r], plan.req_num_tiles[r]
        sl = slice(first, first + n)
        assert (plan.tile_req[sl] == r).all()
        assert (plan.tile_req == r).sum() == n
        starts, ends = plan.tile_start[sl], plan.tile_end[sl]
        order = np.argsort(starts)
        assert starts[order][0] == 0 and ends[order][-1] == length
        assert (starts[order][1:] == ends[order][:-1]).all()  # no gap, no overlap


@pytest.mark.parametrize("mode", ["balanced", "per-tile", "static", "none"])
def test_plan_covers_ragged_lengths(mode: str) -> None:
    lens = np.array([1, 16, 17, 128, 129, 1000, 5, 4096])
    plan = plan_decode_tiles(lens, num_buckets=12, tile_size=128, num_splits=3,
                             mode="balanced" if mode == "per-tile" else mode,  # type: ignore[arg-type]
                             coalesce=mode != "per-tile")
    assert_covers_exactly(plan, lens, 128 if mode == "per-tile" else None)
    if mode == "none":
        assert (plan.req_num_tiles == 1).all()
    if mode == "static":
        assert list(plan.req_num_tiles) == [1, 3, 3, 3, 3, 3, 3, 3]


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(1, 20_000), min_size=1, max_size=300),
    tile_size=st.sampled_from([64, 128, 256]),
    num_buckets=st.integers(1, 300),
    coalesce=st.booleans(),
)
def test_plan_balance_property(lens: list[int], tile_size: int, num_buckets: int, coalesce: bool) -> None:
    arr = np.array(lens)
    plan = plan_decode_tiles(arr, num_buckets=num_buckets, tile_size=tile_size, coalesce=coalesce)
    assert_covers_exactly(plan, arr, None if coalesce else tile_size)
    # The bound: max/mean - 1 <= 5% once there are >= 4 tiles of work per bucket.
    if arr.sum() >= 4 * tile_size * num_buckets:
        assert plan.imbalance() <= 0.05, plan.imbalance()


def test_plan_keeps_requests_together() -> None:
    # 64 equal requests on 16 buckets: 4 whole requests per bucket, none split.
    plan = plan_decode_tiles(np.full(64, 1024), num_buckets=16, tile_size=128, coalesce=False)
    assert (plan.req_num_tiles == 8).all() and plan.imbalance() == 0.0
    runs = plan_decode_tiles(np.full(64, 1024), num_buckets=16, tile_size=128)
    assert (runs.req_num_tiles == 1).all() and runs.num_tiles == 64  # one run per request
    bucket_of_tile = np.repeat(np.arange(16), np.diff(plan.bucket_ptr))
    assert all(len(set(bucket_of_tile[plan.tile_req == r])) == 1 for r in range(64))


def test_plan_is_fast_for_256_requests() -> None:
    rng = np.random.default_rng(0)
    lens = np.clip(rng.lognormal(np.log(1024), 1.0, 256), 1, 65536).astype(np.int64)
    buckets = default_num_buckets(132, 8)
    for _ in range(20):
        plan_decode_tiles(lens, num_buckets=buckets)
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        plan_decode_tiles(lens, num_buckets=buckets)
        times.append(time.perf_counter() - t0)
    # Target is 100 us on an idle core; this shared CI box gets 5x slack against flakiness.
    assert np.median(times) < 500e-6, np.median(times)


def test_default_num_buckets_fills_sms() -> None:
    for sms, heads in [(132, 8), (132, 1), (78, 4), (4, 8)]:
        c = default_num_buckets(sms, heads)
        assert (c * heads) % sms == 0 and c * heads >= sms
