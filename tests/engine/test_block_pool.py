"""The block pool (ref counts, LRU free queue, hash map) and the chained block hashes."""

from __future__ import annotations

import pytest

from tessel.engine.kv_cache.block_pool import NULL_BLOCK, BlockPool
from tessel.engine.kv_cache.prefix_cache import PrefixCacheStats, extend_block_hashes, hash_block


def _h(i: int) -> bytes:
    return hash_block(None, [i])


def test_allocate_never_hands_out_the_null_block_and_tracks_usage() -> None:
    pool = BlockPool(5)
    assert pool.num_usable == 4 and pool.num_free == 4 and pool.usage == 0.0
    blocks = pool.allocate(4)
    assert sorted(blocks) == [1, 2, 3, 4] and NULL_BLOCK not in blocks
    assert pool.num_free == 0 and pool.usage == 1.0
    with pytest.raises(ValueError, match="only 0 free"):
        pool.allocate(1)
    pool.free(blocks)
    assert pool.num_free == 4 and pool.usage == 0.0


def test_too_small_pool_and_double_free_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(1)
    pool = BlockPool(3)
    (block,) = pool.allocate(1)
    pool.free([block])
    with pytest.raises(ValueError, match="not held"):
        pool.free([block])
    with pytest.raises(ValueError, match="not held"):
        pool.free([NULL_BLOCK])


def test_touch_shares_a_block_until_its_last_holder_frees_it() -> None:
    pool = BlockPool(4)
    (block,) = pool.allocate(1)
    pool.cache(block, _h(1))
    pool.touch([block])
    assert pool.ref_count(block) == 2
    pool.free([block])
    assert pool.ref_count(block) == 1 and block not in pool.free_order()
    pool.free([block])
    assert pool.ref_count(block) == 0 and block in pool.free_order()
    assert pool.lookup(_h(1)) == block  # freed but still cached
    pool.touch([block])  # a prefix hit revives it from the free queue
    assert pool.ref_count(block) == 1 and block not in pool.free_order()
    assert pool.num_free == 2


def test_eviction_takes_plain_blocks_first_then_least_recently_freed_cached() -> None:
    pool = BlockPool(6)
    a, b, c, plain, _ = pool.allocate(5)
    for block, i in ((a, 1), (b, 2), (c, 3)):
        pool.cache(block, _h(i))
    pool.free([b])
    pool.free([a])
    pool.free([plain])  # unhashed: goes to the head, reused first
    pool.free([c])
    assert pool.free_order() == [plain, b, a, c]
    assert pool.allocate(1) == [plain]
    assert pool.lookup(_h(2)) == b
    assert pool.allocate(1) == [b]  # least recently freed cached block is evicted first
    assert pool.lookup(_h(2)) is None and pool.block_hash(b) is None
    assert pool.lookup(_h(1)) == a and pool.lookup(_h(3)) == c


def test_a_duplicate_hash_keeps_the_first_block_as_the_shared_copy() -> None:
    pool = BlockPool(4)
    first, second = pool.allocate(2)
    pool.cache(first, _h(7))
    pool.cache(second, _h(7))
    assert pool.lookup(_h(7)) == first and pool.block_hash(second) is None
    pool.free([first, second])
    assert pool.free_order()[0] == second  # the private copy is worthless once free


def test_block_hashes_chain_over_the_whole_prefix_and_skip_partial_blocks() -> None:
    assert hash_block(None, [1, 2]) == hash_block(None, [1, 2])
    assert hash_block(None, [1, 2]) != hash_block(None, [2, 1])
    assert hash_block(_h(1), [5, 6]) != hash_block(_h(2), [5, 6])
    assert hash_block(None, [1 << 40]) != hash_block(None, [0, 1 << 8])
    hashes: list[bytes] = []
    tokens = [1, 2, 3, 4, 5, 6, 7]
    extend_block_hashes(hashes, tokens, block_size=3, num_tokens=7)
    assert hashes == [
        hash_block(None, [1, 2, 3]),
        hash_block(hash_block(None, [1, 2, 3]), [4, 5, 6]),
    ]
    first = hashes[0]
    extend_block_hashes(hashes, tokens + [8, 9], block_size=3, num_tokens=9)
    assert len(hashes) == 3 and hashes[0] is first  # only new blocks are hashed
    other: list[bytes] = []
    extend_block_hashes(other, [9, 2, 3, 4, 5, 6], block_size=3, num_tokens=6)
    assert other[1] != hashes[1]  # same block tokens, different prefix


def test_prefix_stats_hit_rate() -> None:
    stats = PrefixCacheStats()
    assert stats.hit_rate == 0.0
    stats.record(10, 4)
    stats.record(10, 0)
    assert (stats.queries, stats.hits, stats.hit_rate) == (20, 4, 0.2)
