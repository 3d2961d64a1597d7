"""The pool of KV-cache block ids: reference counts, an LRU free queue, and the
hash -> block map that lets full blocks be shared between requests.

Only ids are managed here; the tensors those ids index live in the model runner.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from tessel.engine.kv_cache.prefix_cache import BlockHash

NULL_BLOCK = 0
"""Reserved, never handed out: the runner pads unused block-table entries with it,
so padding reads and writes can never touch a live request's KV."""


class BlockPool:
    """Hands out block ids and takes them back.

    A freed block keeps its hash, so a later request with the same prefix can revive
    it. The free queue is ordered by eviction preference: plain (unhashed) blocks at
    the head, taken first; cached blocks join the tail when their last user lets go,
    so the least recently used cached block is evicted first.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_count = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}
        # OrderedDict as an O(1) deque with removal from the middle (touch revives a block).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self._ref_count[NULL_BLOCK] = 1  # pinned forever

    @property
    def num_usable(self) -> int:
        """Blocks that can ever be handed out (all but the null block)."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks no request holds, cached or not: what ``allocate`` can hand out now."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by some request."""
        return 1.0 - self.num_free / self.num_usable

    def ref_count(self, block: int) -> int:
        return self._ref_count[block]

    def block_hash(self, block: int) -> BlockHash | None:
        return self._hash[block]

    def free_order(self) -> list[int]:
        """The free queue, next-to-be-allocated first (for tests and debugging)."""
        return list(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, each with ref count 1.

        A cached block taken here is evicted: its hash stops resolving to it.
        """
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks: only {len(self._free)} free")
        blocks = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self._ref_count[block] = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Add a reference to each block (a prefix hit), reviving it from the free queue."""
        for block in blocks:
            if self._ref_count[block] == 0:
                del self._free[block]
            self._ref_count[block] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop a reference to each block; at zero it rejoins the free queue.

        Pass a request's blocks last-first, so its tail (least likely to be shared) is
        evicted before its head.
        """
        for block in blocks:
            if block == NULL_BLOCK or self._ref_count[block] <= 0:
                raise ValueError(f"block {block} is not held")
            self._ref_count[block] -= 1
            if self._ref_count[block] == 0:
                self._free[block] = None
                if self._hash[block] is None:  # worthless once free: reuse it first
                    self._free.move_to_end(block, last=False)

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Publish a held, full block under its chained hash.

        If another block already holds that hash (two requests computed the same
        prefix at once), the first one stays the shared copy and this block stays private.
        """
        if self._ref_count[block] <= 0 or block == NULL_BLOCK:
            raise ValueError(f"block {block} is not held")
        if self._hash[block] is not None or block_hash in self._cached:
            return
        self._hash[block] = block_hash
        self._cached[block_hash] = block

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The block holding this hash's KV, held or free, or None."""
        return self._cached.get(block_hash)

    def _evict(self, block: int) -> None:
        block_hash = self._hash[block]
        if block_hash is not None:
            del self._cached[block_hash]
            self._hash[block] = None
