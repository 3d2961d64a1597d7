"""Chained hashes of full KV blocks, the keys of prefix caching, and its hit counters.

A block's hash covers its own tokens and, through its parent's hash, every token
before it: two blocks share a hash only if the whole prefix up to their end matches.
SHA-256 over a fixed binary encoding makes this stable across processes and runs,
and a collision (which would silently serve the wrong KV) practically impossible;
Python's ``hash`` of tuples is 64-bit and salted per process for str, so it is not used.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

BlockHash = bytes  # a 32-byte SHA-256 digest

_ROOT = b"tessel-kv-root"  # parent of the first block


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The hash of one full block, given its parent's (None for the first block)."""
    digest = hashlib.sha256(parent if parent is not None else _ROOT)
    # Signed 64-bit little-endian ids: fixed width, so no two token lists encode alike.
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return digest.digest()


def extend_block_hashes(
    hashes: list[BlockHash], token_ids: Sequence[int], block_size: int, num_tokens: int
) -> None:
    """Append to ``hashes`` the hashes of every full block within ``token_ids[:num_tokens]``
    that it lacks, so a request's hashes are computed once and grow with it."""
    for index in range(len(hashes), num_tokens // block_size):
        parent = hashes[-1] if hashes else None
        start = index * block_size
        hashes.append(hash_block(parent, token_ids[start : start + block_size]))


@dataclass
class PrefixCacheStats:
    """Prefix-cache effectiveness, counted in tokens when a request is admitted."""

    queries: int = 0  # tokens of admitted requests that were looked up
    hits: int = 0  # of those, tokens whose KV came from the cache

    def record(self, num_queried: int, num_hit: int) -> None:
        self.queries += num_queried
        self.hits += num_hit

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
