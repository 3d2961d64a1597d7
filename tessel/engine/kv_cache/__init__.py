"""The paged KV cache's bookkeeping: block ids, ref counts and prefix caching (no tensors)."""

from tessel.engine.kv_cache.block_pool import NULL_BLOCK, BlockPool
from tessel.engine.kv_cache.manager import KVCacheManager
from tessel.engine.kv_cache.prefix_cache import BlockHash, PrefixCacheStats, hash_block

__all__ = [
    "NULL_BLOCK",
    "BlockHash",
    "BlockPool",
    "KVCacheManager",
    "PrefixCacheStats",
    "hash_block",
]
