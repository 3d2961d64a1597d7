"""Split-KV paged decode attention: the balanced tile walk, its static and no-split twins.

One program per (bucket, KV head) walks its bucket's tiles (``plan.py``). Each tile loads the
whole GQA group of query heads once ([G, D] in shared memory), streams its K/V blocks through
the block table with software pipelining, keeps scores in registers and an online softmax,
then either writes the output (the request's only tile) or a partial output and its
log-sum-exp for ``merge.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from kernels.attention.merge import merge_partials
from kernels.attention.metadata import AttentionMetadata
from kernels.attention.plan import (
    SplitMode,
    TilePlan,
    default_num_buckets,
    plan_decode_tiles,
    static_num_splits,
)
from kernels.checks import FLOAT_DTYPES, check_shape, check_tensor

LOG2E = 1.4426950408889634


def autotune_enabled() -> bool:
    """Autotune on a real GPU unless TESSEL_AUTOTUNE=0; never under the interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return os.environ.get("TESSEL_AUTOTUNE", "1") != "0"


def _decode_configs() -> list[triton.Config]:
    # The first entry is the untuned default (also the interpreter's).
    shapes = [(64, 4, 3)]
    if autotune_enabled():
        shapes += [(64, 4, 4), (64, 4, 5), (128, 4, 3), (128, 8, 3), (32, 4, 4), (32, 4, 6), (64, 8, 4)]
    return [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s) for n, w, s in shapes]


@triton.autotune(configs=_decode_configs(), key=["HEAD_DIM", "GROUP_PAD", "PAGE"])
@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    block_tables_ptr, sched_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt,
    num_tiles, bucket_off, first_off, count_off, num_q_heads,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, PAGE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):
    bucket = tl.program_id(0)
    kvh = tl.program_id(1)
    t_lo = tl.load(sched_ptr + bucket_off + bucket)
    t_hi = tl.load(sched_ptr + bucket_off + bucket + 1)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    k_base = k_ptr + kvh * stride_kh + offs_d[None, :]
    v_base = v_ptr + kvh * stride_vh + offs_d[None, :]
    for t in range(t_lo, t_hi):
        req = tl.load(sched_ptr + t)
        start = tl.load(sched_ptr + num_tiles + t)
        end = tl.load(sched_ptr + 2 * num_tiles + t)
        q = tl.load(
            q_ptr + req * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=g_mask[:, None], other=0.0,
        ).to(k_ptr.dtype.element_ty)
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        table = block_tables_ptr + req.to(tl.int64) * stride_bt
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + offs_n
            valid = pos < end
            blk = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
            off = pos % PAGE
            k = tl.load(k_base + (blk * stride_kb + off * stride_ks)[:, None], mask=valid[:, None], other=0.0)
            v = tl.load(v_base + (blk * stride_vb + off * stride_vs)[:, None], mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        acc = acc / l_i[:, None]
        if tl.load(sched_ptr + count_off + req) == 1:
            o_ptr = out_ptr + req * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
            tl.store(o_ptr, acc.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
        else:
            row = t * num_q_heads + heads  # int32 is enough below 2**31 / (Hq * D) tiles
            tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=g_mask[:, None])
            tl.store(part_lse_ptr + row, m_i + tl.log2(l_i), mask=g_mask)


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


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    plan: DecodePlan,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request: q [B, Hq, D] over the paged cache -> [B, Hq, D]."""
    _check_decode_args(q, k_cache, v_cache, block_tables, plan)
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    c, bucket_off, first_off, count_off = plan.offsets
    _decode_kernel[(plan.grid_buckets, num_kv_heads)](
        q, k_cache, v_cache, out, plan.part_out, plan.part_lse, block_tables, plan.sched,
        scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        c, bucket_off, first_off, count_off, num_q_heads,
        HEAD_DIM=head_dim, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        PAGE=page, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    if plan.needs_merge:
        merge_partials(out, plan.part_out, plan.part_lse, plan.sched, first_off=first_off, batch=batch)
    return out


def _check_decode_args(q, k_cache, v_cache, block_tables, plan) -> None:  # type: ignore[no-untyped-def]
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, ndim=4, dtypes=FLOAT_DTYPES, device=q.device)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,), device=q.device)
    check_shape("v_cache", v_cache, k_cache.shape)
    check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32,), device=q.device)
    batch, num_q_heads, head_dim = q.shape
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache head_dim {k_cache.shape[3]} != q head_dim {head_dim}")
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    if num_q_heads % k_cache.shape[2]:
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of KV heads ({k_cache.shape[2]})")
    if block_tables.shape[0] != batch or plan.host.req_num_tiles.shape[0] != batch:
        raise ValueError(f"block_tables rows ({block_tables.shape[0]}) and the plan must match batch {batch}")
