"""Paged attention on CUDA: the split-KV decode path for decode-only steps, prefill otherwise."""

from __future__ import annotations

import torch

from tessel.kernels.attention.decode import (
    DEFAULT_DECODE,
    DecodeConfig,
    decode_plan_for,
    paged_decode,
)
from tessel.kernels.attention.decode_plan import ENGINE_PLAN
from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.attention.prefill import paged_prefill


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
    decode: DecodeConfig = DEFAULT_DECODE,
) -> torch.Tensor:
    """Same contract as ``reference.paged_attention``: q [T, Hq, D] -> [T, Hq, D].

    A decode-only step uses the plan the engine put in ``md.scratch[ENGINE_PLAN]`` (its split
    mode and static, graph-capturable buffers); without one it plans its tiles on the first layer (cached in ``md.scratch``) and every
    later layer reuses the plan; mixed and prefill steps run the FA2-style extend kernel.
    """
    if md.is_decode_only:
        num_q_heads, head_dim = q.shape[1:]
        plan = md.scratch.get(ENGINE_PLAN)  # planned by the engine (static buffers), else here
        if plan is None:
            plan = decode_plan_for(md, num_q_heads, k_cache.shape[2], head_dim, q.device, decode)
        tables = md.scratch.get("block_tables_i32")
        if tables is None:
            tables = md.scratch["block_tables_i32"] = md.block_tables.to(q.device, torch.int32)
        return paged_decode(q, k_cache, v_cache, tables, plan, scale)
    return paged_prefill(q, k_cache, v_cache, md, scale)
