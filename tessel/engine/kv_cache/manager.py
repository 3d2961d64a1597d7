"""Per-request block lists on top of the block pool: prefix lookups, all-or-nothing
slot allocation, publishing newly full blocks, and freeing."""

from __future__ import annotations

from tessel.engine.kv_cache.block_pool import BlockPool
from tessel.engine.kv_cache.block_tables import BlockTables
from tessel.engine.kv_cache.prefix_cache import BlockHash, PrefixCacheStats, extend_block_hashes
from tessel.engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Which blocks each request holds, keyed by request id.

    Block ``i`` of a request holds the KV of its tokens ``[i * block_size, (i+1) * block_size)``.
    Only full blocks are ever shared; a request's last, partial block is always its own.
    """

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.prefix_stats = PrefixCacheStats()
        self._blocks: dict[str, list[int]] = {}
        self._hashes: dict[str, list[BlockHash]] = {}  # chained hashes of the full blocks so far
        self._num_published: dict[str, int] = {}  # leading blocks already in the pool's cache
        self.tables = BlockTables()  # the lists above as array rows, for stage 1

    @property
    def num_total_blocks(self) -> int:
        """Blocks a request can use (the null block excluded)."""
        return self.pool.num_usable

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        return self.pool.usage

    def num_blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def block_table(self, request_id: str) -> list[int]:
        """A copy of the request's block ids, in token order (empty if it holds none)."""
        return list(self._blocks.get(request_id, ()))

    def table_slot(self, request_id: str) -> tuple[int, int]:
        """The request's row in ``tables.array`` and how many of its columns are its blocks."""
        return self.tables.row(request_id), len(self._blocks[request_id])

    def takes_prefix_hits(self, request: Request) -> bool:
        """Whether the request may reuse cached blocks. Not one that wants prompt
        logprobs: those need the logits of every prompt position, so all are computed."""
        return self.enable_prefix_caching and request.params.prompt_logprobs is None

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The longest run of cached full blocks matching the request's tokens, and the
        number of tokens they cover. Never the whole request: its last token is left to
        compute so the step has logits to sample from. Takes no reference yet."""
        if not self.takes_prefix_hits(request):
            return [], 0
        hashes = self._hashes.setdefault(request.request_id, [])
        tokens = request.all_token_ids
        extend_block_hashes(hashes, tokens, self.block_size, len(tokens))
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks: list[int] = []
        for block_hash in hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached_blocks: list[int] | None = None
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the request's computed ones
        (and after ``cached_blocks``, the prefix hits of a request being admitted).

        All or nothing: False, with nothing changed, when the pool is too small.
        """
        rid = request.request_id
        held = self._blocks.get(rid)
        if held is not None and not cached_blocks:  # a running request: most steps need no block
            end = request.num_computed_tokens + num_new_tokens
            if end <= len(held) * self.block_size:
                return True
        held = held if held is not None else []
        cached = cached_blocks or []
        if cached and held:
            raise ValueError(f"request {rid} already holds blocks; prefix hits are for admission")
        num_tokens = request.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        num_needed = max(0, self.num_blocks_for(num_tokens) - len(held) - len(cached))
        # A hit on a free cached block takes it out of the free queue, so it can't count twice.
        num_revived = sum(1 for block in cached if self.pool.ref_count(block) == 0)
        if num_needed > self.pool.num_free - num_revived:
            return False
        if rid not in self._blocks:
            if self.enable_prefix_caching:
                self.prefix_stats.record(request.num_tokens, len(cached) * self.block_size)
            self._num_published[rid] = len(cached)
        self.pool.touch(cached)
        # In place: rebuilding the list would cost O(blocks held) per decode step.
        blocks = self._blocks.setdefault(rid, held)
        start = len(blocks)
        blocks += cached
        blocks += self.pool.allocate(num_needed)
        self.tables.append(rid, start, blocks[start:])
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Publish the request's blocks that its computed tokens have filled since the
        last call, so later requests with the same prefix can share them."""
        rid = request.request_id
        if not self.enable_prefix_caching or rid not in self._blocks:
            return
        num_full = request.num_computed_tokens // self.block_size
        start = self._num_published[rid]
        if num_full <= start:
            return
        hashes = self._hashes.setdefault(rid, [])
        extend_block_hashes(
            hashes, request.all_token_ids, self.block_size, request.num_computed_tokens
        )
        blocks = self._blocks[rid]
        for index in range(start, num_full):
            self.pool.cache(blocks[index], hashes[index])
        self._num_published[rid] = num_full

    def free(self, request_id: str) -> None:
        """Release every block the request holds (idempotent; unknown ids are ignored)."""
        blocks = self._blocks.pop(request_id, [])
        self.pool.free(reversed(blocks))
        self.tables.release(request_id, len(blocks))
        self._hashes.pop(request_id, None)
        self._num_published.pop(request_id, None)
