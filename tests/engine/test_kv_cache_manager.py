"""The KV-cache manager: per-request block lists, prefix hits, all-or-nothing allocation."""

from __future__ import annotations

from tessel.engine.kv_cache.manager import KVCacheManager
from tessel.engine.kv_cache.prefix_cache import hash_block
from tessel.engine.request import Request
from tests.factories import make_request

BS = 4


def _compute(
    kv: KVCacheManager, request: Request, num_tokens: int, cached: list[int] | None = None
) -> None:
    """Allocate and pretend the step computed ``num_tokens`` more tokens."""
    start = len(cached or []) * BS if cached else request.num_computed_tokens
    assert kv.allocate_slots(request, num_tokens, cached)
    request.num_computed_tokens = start + num_tokens
    kv.cache_full_blocks(request)


def test_block_list_grows_one_block_per_block_size_tokens() -> None:
    kv = KVCacheManager(num_blocks=9, block_size=BS)
    request = make_request("a", 6)
    assert kv.allocate_slots(request, 6)
    assert len(kv.block_table("a")) == 2
    request.num_computed_tokens = 6
    assert kv.allocate_slots(request, 2)  # positions 6, 7: still block 2
    assert len(kv.block_table("a")) == 2
    request.num_computed_tokens = 8
    assert kv.allocate_slots(request, 1)
    assert len(kv.block_table("a")) == 3 and kv.num_free_blocks == 5
    kv.free("a")
    kv.free("a")  # idempotent
    kv.free("never-seen")
    assert kv.num_free_blocks == 8 and kv.block_table("a") == []


def test_allocation_is_all_or_nothing() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BS)  # 3 usable blocks
    a, b = make_request("a", 8), make_request("b", 8)
    assert kv.allocate_slots(a, 8)
    table = kv.block_table("a")
    assert not kv.allocate_slots(b, 8)
    assert kv.block_table("b") == [] and kv.num_free_blocks == 1 and kv.block_table("a") == table
    kv.free("a")
    assert kv.num_free_blocks == 3


def test_same_prompt_hits_full_blocks_and_shares_them() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    prompt = list(range(10))  # blocks [0..3] [4..7] + partial [8, 9]
    first = make_request("first", prompt)
    _compute(kv, first, 10)
    second = make_request("second", prompt)
    blocks, num_cached = kv.get_computed_blocks(second)
    assert blocks == kv.block_table("first")[:2] and num_cached == 8
    _compute(kv, second, 2, blocks)
    shared = kv.block_table("second")
    assert shared[:2] == blocks and shared[2] != kv.block_table("first")[2]
    assert [kv.pool.ref_count(b) for b in shared] == [2, 2, 1]
    assert (kv.prefix_stats.queries, kv.prefix_stats.hits) == (20, 8)
    kv.free("first")
    assert [kv.pool.ref_count(b) for b in shared] == [1, 1, 1]
    kv.free("second")
    assert kv.num_free_blocks == kv.num_total_blocks


def test_a_freed_request_is_evicted_tail_first() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=BS)  # 5 usable
    _compute(kv, make_request("a", list(range(12))), 12)  # three full, cached blocks
    table = kv.block_table("a")
    kv.free("a")
    # Its last block is the least likely to be shared, so it goes first.
    assert kv.pool.free_order()[-3:] == table[::-1]
    assert kv.get_computed_blocks(make_request("b", list(range(9))))[1] == 8
    kv.free("b")


def test_a_hit_never_covers_the_last_prompt_token() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    prompt = list(range(8))  # exactly two full blocks
    _compute(kv, make_request("first", prompt), 8)
    blocks, num_cached = kv.get_computed_blocks(make_request("second", prompt))
    assert len(blocks) == 1 and num_cached == 4  # token 7 must be computed to sample
    kv.free("first")
    kv.free("second")


def test_a_different_prefix_breaks_the_chain() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    _compute(kv, make_request("first", [1, 2, 3, 4, 5, 6, 7, 8, 9]), 9)
    blocks, num_cached = kv.get_computed_blocks(make_request("x", [0, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert (blocks, num_cached) == ([], 0)  # block 2 matches by content, not by prefix
    blocks, num_cached = kv.get_computed_blocks(make_request("y", [1, 2, 3, 4, 0, 6, 7, 8, 9]))
    assert num_cached == 4
    for rid in ("first", "x", "y"):
        kv.free(rid)
    assert kv.num_free_blocks == kv.num_total_blocks


def test_freed_cached_blocks_are_revived_without_counting_them_as_free_twice() -> None:
    kv = KVCacheManager(num_blocks=5, block_size=BS)  # 4 usable
    prompt = list(range(9))
    _compute(kv, make_request("first", prompt), 9)  # 3 blocks, 2 of them cached
    kv.free("first")
    assert kv.num_free_blocks == 4
    second = make_request("second", prompt + list(range(100, 107)))  # 16 tokens: 4 blocks
    blocks, num_cached = kv.get_computed_blocks(second)
    assert num_cached == 8
    # 2 revived + 3 new > 4 usable: must fail without evicting the hits it was given.
    assert not kv.allocate_slots(second, 9, blocks)
    assert kv.pool.lookup(kv.pool.block_hash(blocks[0]) or b"") == blocks[0]
    assert kv.num_free_blocks == 4 and kv.block_table("second") == []
    assert kv.allocate_slots(second, 8, blocks)  # 2 revived + 2 new fit
    assert kv.block_table("second")[:2] == blocks and kv.num_free_blocks == 0
    kv.free("second")
    assert kv.num_free_blocks == 4


def test_output_tokens_are_cached_too() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    first = make_request("first", [1, 2, 3])
    _compute(kv, first, 3)
    first.output_token_ids += [4, 5]  # token 4's KV is computed by the next decode
    _compute(kv, first, 1)
    assert kv.pool.lookup(hash_block(None, [1, 2, 3, 4])) == kv.block_table("first")[0]
    blocks, num_cached = kv.get_computed_blocks(make_request("again", [1, 2, 3, 4, 5]))
    assert num_cached == 4 and blocks == kv.block_table("first")[:1]
    kv.free("first")
    kv.free("again")


def test_disabled_prefix_caching_never_hits_or_counts() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    prompt = list(range(10))
    _compute(kv, make_request("first", prompt), 10)
    assert kv.get_computed_blocks(make_request("second", prompt)) == ([], 0)
    assert kv.prefix_stats.queries == 0
    assert all(kv.pool.block_hash(b) is None for b in range(1, 16))
    kv.free("first")
    assert kv.num_free_blocks == kv.num_total_blocks


def test_a_request_wanting_prompt_logprobs_computes_its_whole_prompt() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    prompt = list(range(10))
    _compute(kv, make_request("first", prompt), 10)
    echo = make_request("echo", prompt, prompt_logprobs=0)
    assert not kv.takes_prefix_hits(echo)
    assert kv.get_computed_blocks(echo) == ([], 0)
    _compute(kv, echo, 10)  # its own full blocks are still published (first copy wins)
    assert kv.get_computed_blocks(make_request("later", prompt))[1] == 8
    for rid in ("first", "echo", "later"):
        kv.free(rid)
    assert kv.num_free_blocks == kv.num_total_blocks
