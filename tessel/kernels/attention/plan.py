"""Decode tile planner: split every request's KV into tiles and pack them onto a fixed grid.

Built once per engine step (``plan_decode_tiles``) and reused by every layer. A *tile* is
``(request, token range)`` of at most ``tile_size`` cached tokens; the kernel's second grid
axis replicates the plan over KV heads (every KV head of a request costs the same), so the
planner's work does not grow with the head count.

Balanced mode is greedy longest-first packing with splitting at bucket boundaries: requests
are laid longest first on one stream of work (each tile costs its tokens plus a fixed
overhead), and the stream is cut into ``num_buckets`` equal loads. A bucket so holds a run of
consecutive tiles of few requests, and a tile that straddles a cut is split in two, so loads
differ by at most one tile overhead instead of one tile (plain LPT over indivisible tiles
cannot beat ~1/(tiles per bucket) imbalance). All numpy, no Python loop over tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

SplitMode = Literal["balanced", "static", "none"]

# Per-tile fixed cost in token-equivalents: loading the query group, the loop prologue and
# writing a partial output (G x D fp32 + lse) against T tokens of K and V (2 x T x D x 2 bytes).
TILE_OVERHEAD_TOKENS = 16


@dataclass
class TilePlan:
    """One step's decode schedule as flat int32 arrays (the kernel reads them on the device).

    An entry is a tile, or with ``coalesce`` a run of a request's consecutive tiles in one
    bucket; loads are still charged one overhead per T tokens (``bucket_loads``).

    Tiles are stored in bucket order; bucket ``c`` runs tiles ``bucket_ptr[c]:bucket_ptr[c+1]``.
    A request's tiles are contiguous: ``req_first_tile[r] : req_first_tile[r] + req_num_tiles[r]``.
    """

    tile_req: np.ndarray  # [num_tiles] request index of each tile
    tile_start: np.ndarray  # [num_tiles] first cached token of the tile
    tile_end: np.ndarray  # [num_tiles] one past its last token
    bucket_ptr: np.ndarray  # [num_buckets + 1] CSR offsets of each bucket's tiles
    req_first_tile: np.ndarray  # [batch] index of each request's first tile
    req_num_tiles: np.ndarray  # [batch] tiles per request; 1 means the kernel writes the output
    tile_overhead: int  # token-equivalents charged per T-tile in the loads below
    tile_size: int  # T, the unit the loads are charged in
    flat: np.ndarray  # all six arrays above, back to back (they are views of it)

    @property
    def num_tiles(self) -> int:
        return int(self.tile_req.shape[0])

    @property
    def num_buckets(self) -> int:
        return int(self.bucket_ptr.shape[0] - 1)

    def bucket_loads(self) -> np.ndarray:
        """Cost of every bucket: its tokens plus one overhead per (started) T-tile."""
        n = (self.tile_end - self.tile_start).astype(np.int64)
        cost = n + self.tile_overhead * -(-n // self.tile_size)
        bucket = np.repeat(np.arange(self.num_buckets), np.diff(self.bucket_ptr))
        return np.bincount(bucket, weights=cost, minlength=self.num_buckets)

    def imbalance(self) -> float:
        """Max bucket load / mean bucket load - 1 (0 is perfect)."""
        loads = self.bucket_loads()
        mean = loads.mean() if loads.size else 0.0
        return float(loads.max() / mean - 1.0) if mean > 0 else 0.0


def plan_decode_tiles(
    seq_lens: np.ndarray,
    *,
    num_buckets: int,
    tile_size: int = 128,
    mode: SplitMode = "balanced",
    num_splits: int = 1,
    tile_overhead: int = TILE_OVERHEAD_TOKENS,
    coalesce: bool = True,
) -> TilePlan:
    """Plan one decode step. ``seq_lens``: [batch] context lengths (all >= 1).

    ``balanced``: tiles of <= tile_size tokens packed onto ``num_buckets`` buckets.
    ``static``: ``num_splits`` equal ranges per request, one bucket each (FlashDecoding).
    ``none``: one tile per request, one bucket each.
    ``coalesce``: emit each bucket's consecutive tiles of one request as a single run, so the
    kernel streams it in one pipelined loop (the balance is the same; only the T-granular
    tile boundaries that no bucket cut falls on disappear).
    """
    lens = np.ascontiguousarray(seq_lens, dtype=np.int64).reshape(-1)
    if lens.size and int(lens.min()) < 1:
        raise ValueError("seq_lens must all be >= 1 for decode")
    if tile_size < 1 or num_buckets < 1 or num_splits < 1:
        raise ValueError("tile_size, num_buckets and num_splits must be >= 1")
    if mode == "balanced":
        return _plan_balanced(lens, num_buckets, tile_size, tile_overhead, coalesce)
    if mode == "static":
        return _plan_static(lens, num_splits, tile_overhead)
    if mode == "none":
        return _plan_static(lens, 1, tile_overhead)
    raise ValueError(f"unknown split mode {mode!r}; expected balanced, static or none")


def _plan_static(lens: np.ndarray, num_splits: int, overhead: int) -> TilePlan:
    splits = np.minimum(num_splits, lens)  # never an empty split
    chunk = -(-lens // splits)
    splits = -(-lens // chunk)
    req = np.repeat(np.arange(lens.size), splits)
    first = np.concatenate(([0], np.cumsum(splits)[:-1])).astype(np.int64)
    idx = np.arange(req.size) - first[req]
    start = idx * chunk[req]
    end = np.minimum(start + chunk[req], lens[req])
    return _pack(req, start, end, np.arange(req.size + 1), first, splits, overhead, int(chunk.max(initial=1)))


def _plan_balanced(
    lens: np.ndarray, num_buckets: int, tile: int, overhead: int, coalesce: bool
) -> TilePlan:
    # Few, whole-array numpy calls: at this size their fixed cost, not the data, is the time.
    # Request level (O(batch)): longest first, each natural tile costs overhead + its tokens.
    order = (-lens).argsort(kind="stable")
    lens_s = lens[order]
    n_nat = (lens_s + (tile - 1)) // tile
    cost = lens_s + overhead * n_nat
    v_end = cost.cumsum()  # virtual stream: overhead, then tokens, for every natural tile
    tok_end = lens_s.cumsum()  # the same stream counted in tokens only
    tok0 = tok_end - lens_s
    work, total = int(v_end[-1]), int(tok_end[-1])
    # Small batches: do not shred work into tiles much smaller than a tile.
    used = max(1, min(num_buckets, work // (tile // 4 + overhead)))
    # Cuts (O(buckets)): bucket c starts at virtual ceil(c * work / used); map that to a token
    # (a cut inside a tile's overhead moves to the tile's first token).
    x = (np.arange(1, used, dtype=np.int64) * work + (used - 1)) // used
    r = v_end.searchsorted(x, side="right")
    j, u = np.divmod(x - (v_end - cost)[r], tile + overhead)
    cut = tok0[r] + j * tile + np.maximum(u - overhead, 0)
    # Boundaries: request starts (plus every T-tile start unless coalescing), plus the cuts.
    if coalesce:
        g = np.concatenate((tok0, cut))
    else:
        nat_first = n_nat.cumsum() - n_nat
        nat = np.repeat(tok0 - nat_first * tile, n_nat) + np.arange(int(n_nat.sum())) * tile
        g = np.concatenate((nat, cut))
    g.sort()
    if g.size > 1:  # a cut on a request start (or another cut) is one boundary, not two
        keep = np.empty(g.size, dtype=bool)
        keep[0] = True
        np.not_equal(g[1:], g[:-1], out=keep[1:])
        g = g[keep]
    req_pos = tok0.searchsorted(g, side="right") - 1
    first_pos = g.searchsorted(tok0)
    n = g.size
    plan = _alloc(n, num_buckets, lens.size, overhead, tile)
    plan.tile_req[:] = order[req_pos]
    base = tok0[req_pos]
    plan.tile_start[:] = g - base
    plan.tile_end[:-1] = g[1:]
    plan.tile_end[-1] = total
    plan.tile_end -= base
    plan.bucket_ptr[0] = 0
    plan.bucket_ptr[1:used] = g.searchsorted(cut)
    plan.bucket_ptr[used:] = n
    plan.req_first_tile[order] = first_pos
    num = np.empty_like(first_pos)
    num[:-1] = first_pos[1:] - first_pos[:-1]
    num[-1] = n - first_pos[-1]
    plan.req_num_tiles[order] = num
    return plan


def _alloc(n: int, buckets: int, batch: int, overhead: int, tile: int) -> TilePlan:
    """A plan whose arrays are views of one int32 buffer (uploaded to the GPU in one copy)."""
    flat = np.empty(3 * n + buckets + 1 + 2 * batch, dtype=np.int32)
    a, b = 3 * n + buckets + 1, 3 * n + buckets + 1 + batch
    views = flat[:n], flat[n : 2 * n], flat[2 * n : 3 * n], flat[3 * n : a], flat[a:b], flat[b:]
    return TilePlan(*views, tile_overhead=overhead, tile_size=tile, flat=flat)


def _pack(req, start, end, bucket_ptr, first, num, overhead: int, tile: int) -> TilePlan:  # type: ignore[no-untyped-def]
    plan = _alloc(len(req), len(bucket_ptr) - 1, len(first), overhead, tile)
    plan.tile_req[:], plan.tile_start[:], plan.tile_end[:] = req, start, end
    plan.bucket_ptr[:], plan.req_first_tile[:], plan.req_num_tiles[:] = bucket_ptr, first, num
    return plan


def default_num_buckets(num_sms: int, num_kv_heads: int, waves: int = 4) -> int:
    """Buckets per KV head so that buckets x KV heads is a multiple of the SM count."""
    per = num_sms // math.gcd(num_sms, num_kv_heads)  # buckets * heads == lcm(sms, heads)
    return per * max(1, waves * num_sms // (per * num_kv_heads) or 1)


def static_num_splits(batch: int, num_kv_heads: int, num_sms: int, max_splits: int = 32) -> int:
    """FlashDecoding's choice: split only as much as needed to fill the GPU about twice."""
    programs = max(1, batch * num_kv_heads)
    return int(max(1, min(max_splits, round(2 * num_sms / programs))))
