"""The decode step's plan on the device: split-KV settings, the tile schedule's fixed layout,
and static buffers a CUDA graph can be captured over. No Triton here: the engine plans on any host."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.attention.plan import (
    SplitMode,
    TilePlan,
    default_num_buckets,
    plan_decode_tiles,
    static_num_splits,
)


@dataclass(frozen=True)
class DecodeConfig:
    """How decode attention splits the KV (the comparison variants live in the same code)."""

    mode: SplitMode = "balanced"  # balanced | static (FlashDecoding) | none
    tile_size: int = 128  # T: most cached tokens per tile (balanced)
    waves: int = 4  # balanced grid = waves x SM count programs (H200 sweep: 4 beat 1, 2 and 8)
    num_splits: int | None = None  # static: splits per request; None picks FlashDecoding's heuristic
    coalesce: bool = True  # balanced: walk a bucket's consecutive tiles of a request as one run


DEFAULT_DECODE = DecodeConfig()


@dataclass
class DecodePlan:
    """A tile plan on the device plus the buffers every layer of the step reuses.

    The schedule's layout is fixed by ``(tile_capacity, grid_buckets, batch)``, not by the
    step's tile count, so a plan written into the same buffers step after step launches the
    kernels with the same arguments: what a captured CUDA graph needs (``StaticDecodePlan``).
    """

    host: TilePlan
    sched: torch.Tensor  # int32: tile_req | tile_start | tile_end | bucket_ptr | req_first | req_num
    part_out: torch.Tensor  # [tile_capacity, Hq, D] fp32 partial outputs
    part_lse: torch.Tensor  # [tile_capacity, Hq] fp32 log2-sum-exp of each partial
    needs_merge: bool
    tile_capacity: int = 0  # stride of the three tile arrays in ``sched`` (>= host.num_tiles)
    grid_buckets: int = 0  # programs on the grid's first axis (>= host.num_buckets; extras idle)

    def __post_init__(self) -> None:
        self.tile_capacity = self.tile_capacity or self.host.num_tiles
        self.grid_buckets = self.grid_buckets or self.host.num_buckets

    @property
    def batch(self) -> int:
        return int(self.host.req_num_tiles.shape[0])

    @property
    def offsets(self) -> tuple[int, int, int, int]:
        """(tile stride, bucket_ptr, req_first_tile, req_num_tiles) offsets into ``sched``."""
        c, nb = self.tile_capacity, self.grid_buckets
        return c, 3 * c, 3 * c + nb + 1, 3 * c + nb + 1 + self.batch


def static_layout_size(tile_capacity: int, grid_buckets: int, batch: int) -> int:
    """int32 entries of a schedule laid out for ``tile_capacity`` tiles and ``grid_buckets``."""
    return 3 * tile_capacity + grid_buckets + 1 + 2 * batch


def write_static_layout(host: TilePlan, out: np.ndarray, tile_capacity: int, grid_buckets: int) -> None:
    """Copy ``host`` into ``out`` (int32) at the fixed offsets of ``DecodePlan.offsets``;
    buckets past the plan's own are empty (their pointers all equal the tile count)."""
    n, nb, batch, c = host.num_tiles, host.num_buckets, host.req_num_tiles.shape[0], tile_capacity
    if n > c or nb > grid_buckets:
        raise ValueError(f"plan of {n} tiles / {nb} buckets exceeds the layout's {c} / {grid_buckets}")
    out[:n] = host.tile_req
    out[c : c + n] = host.tile_start
    out[2 * c : 2 * c + n] = host.tile_end
    b0 = 3 * c
    out[b0 : b0 + nb + 1] = host.bucket_ptr
    out[b0 + nb + 1 : b0 + grid_buckets + 1] = n
    r0 = b0 + grid_buckets + 1
    out[r0 : r0 + batch] = host.req_first_tile
    out[r0 + batch : r0 + 2 * batch] = host.req_num_tiles


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a tiny fake GPU so tests exercise several buckets


def build_decode_plan(
    seq_lens: torch.Tensor | np.ndarray,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    device: torch.device,
    config: DecodeConfig = DEFAULT_DECODE,
) -> DecodePlan:
    """Plan a decode step once (CPU numpy) and upload the schedule as one int32 tensor."""
    lens = seq_lens.cpu().numpy() if isinstance(seq_lens, torch.Tensor) else np.asarray(seq_lens)
    sms = _num_sms(device)
    host = plan_decode_tiles(
        lens,
        num_buckets=default_num_buckets(sms, num_kv_heads, config.waves),
        tile_size=config.tile_size,
        mode=config.mode,
        num_splits=config.num_splits or static_num_splits(lens.size, num_kv_heads, sms),
        coalesce=config.coalesce,
    )
    sched = torch.from_numpy(host.flat).to(device, non_blocking=True)
    needs_merge = bool((host.req_num_tiles > 1).any())
    rows = host.num_tiles if needs_merge else 1
    part_out = torch.empty(rows, num_q_heads, head_dim, device=device, dtype=torch.float32)
    part_lse = torch.empty(rows, num_q_heads, device=device, dtype=torch.float32)
    return DecodePlan(host, sched, part_out, part_lse, needs_merge)


def decode_plan_for(
    md: AttentionMetadata, num_q_heads: int, num_kv_heads: int, head_dim: int,
    device: torch.device, config: DecodeConfig = DEFAULT_DECODE,
) -> DecodePlan:
    """The step's plan, built by the first layer and cached in ``md.scratch``."""
    key = decode_plan_key(num_q_heads, num_kv_heads, head_dim, config)
    plan = md.scratch.get(key)  # type: ignore[call-overload]
    if plan is None:
        seq_lens = md.seq_lens_cpu if md.seq_lens_cpu is not None else md.seq_lens
        plan = build_decode_plan(seq_lens, num_q_heads, num_kv_heads, head_dim, device, config)
        md.scratch[key] = plan  # type: ignore[index]
    assert isinstance(plan, DecodePlan)
    return plan


ENGINE_PLAN = "engine_decode_plan"
"""``md.scratch`` key of a plan the engine built for the step; attention uses it as is."""


def decode_plan_key(num_q_heads: int, num_kv_heads: int, head_dim: int, config: DecodeConfig) -> tuple:  # type: ignore[type-arg]
    """Where ``decode_plan_for`` looks for (and caches) the step's plan in ``md.scratch``."""
    return ("decode_plan", num_q_heads, num_kv_heads, head_dim, config)


class StaticDecodePlan:
    """Schedule and partial buffers allocated once for up to ``max_batch`` requests.

    Planning a step rewrites a host array (``plan``) that the caller copies into ``sched``;
    the kernels' arguments depend only on the (padded) batch size, so a CUDA graph captured
    for that size replays correctly with any later plan of the same size.
    """

    def __init__(
        self, max_batch: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
        device: torch.device, config: DecodeConfig = DEFAULT_DECODE, max_seq_len: int = 1,
    ) -> None:
        self.config, self.num_kv_heads, self.max_batch = config, num_kv_heads, max_batch
        self.sms = _num_sms(device)
        self.num_buckets = default_num_buckets(self.sms, num_kv_heads, config.waves)
        self.max_tiles_per_req = -(-max(max_seq_len, 1) // config.tile_size)
        c_max = max(self.layout(b)[0] for b in range(1, max_batch + 1))
        self.size = max(static_layout_size(*self.layout(b), b) for b in range(1, max_batch + 1))
        self.sched = torch.zeros(self.size, dtype=torch.int32, device=device)
        self.part_out = torch.empty(c_max, num_q_heads, head_dim, device=device, dtype=torch.float32)
        self.part_lse = torch.empty(c_max, num_q_heads, device=device, dtype=torch.float32)

    def layout(self, batch: int) -> tuple[int, int]:
        """(tile capacity, grid buckets) of a step of ``batch`` requests."""
        cfg = self.config
        if cfg.mode == "balanced":
            per_req = 1 if cfg.coalesce else self.max_tiles_per_req
            return batch * per_req + self.num_buckets, self.num_buckets
        if cfg.mode == "static":
            c = batch * (cfg.num_splits or static_num_splits(batch, self.num_kv_heads, self.sms))
            return c, c
        return batch, batch

    def plan(self, seq_lens: np.ndarray, host_out: np.ndarray) -> DecodePlan:
        """Plan ``seq_lens`` (padded rows included) into ``host_out`` (int32, >= ``size``)."""
        batch = int(seq_lens.shape[0])
        if batch > self.max_batch:
            raise ValueError(f"batch {batch} exceeds the static plan's {self.max_batch}")
        cfg = self.config
        host = plan_decode_tiles(
            seq_lens, num_buckets=self.num_buckets, tile_size=cfg.tile_size, mode=cfg.mode,
            num_splits=cfg.num_splits or static_num_splits(batch, self.num_kv_heads, self.sms),
            coalesce=cfg.coalesce,
        )
        c, grid = self.layout(batch)
        write_static_layout(host, host_out, c, grid)
        return DecodePlan(host, self.sched, self.part_out, self.part_lse, True, c, grid)
