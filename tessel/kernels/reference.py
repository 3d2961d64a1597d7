"""Plain-PyTorch twins of every kernel: the CPU engine runs these, and kernel tests compare to them.

KV cache layout (shared with the Triton kernels): one tensor per layer for K and one for V,
each ``[num_blocks, block_size, num_kv_heads, head_dim]``; token ``t`` of a request lives at
slot ``block_tables[b, t // block_size] * block_size + t % block_size``. The cache holds the
model dtype or E4M3 (scale 1.0); attention reads it back in the query's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.sampling_types import TemperatureDraws

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf.to(dtype) if dtype != torch.float32 else xf) * weight


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x`` then normalise it; returns (normed, new residual)."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for the fused gate/up projection."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding (rotate the two halves), as HF Llama does.

    q: [T, Hq, D], k: [T, Hkv, D], positions: [T], cos_sin_cache: [max_pos, D] holding
    cos in the first D/2 columns and sin in the last D/2.
    """
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def sample_tokens(
    logits: torch.Tensor, draws: TemperatureDraws | None = None
) -> torch.Tensor:
    """Gumbel-max over ``logits / T`` (argmax where ``draws`` is None or a row's 1/T is 0), the
    uniforms drawn per row from a generator keyed by (seed, step): the same distribution and
    keying as the Triton kernel, not the same stream (that is Philox, this torch's generator)."""
    scores = logits.float().clone()
    if draws is not None:
        for row, inv_t in enumerate(draws.inv_temperature.tolist()):
            if inv_t > 0:
                key = int(draws.seeds[row]) * 1_000_003 + int(draws.steps[row])
                u = torch.rand(scores.shape[1], generator=torch.Generator().manual_seed(key)).to(scores.device)
                scores[row] = scores[row] * inv_t - torch.log(-torch.log(u))
    return scores.argmax(dim=-1)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each new token's K and V into its cache slot; slots < 0 (padding) are skipped."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    for new, cache in ((k[keep], k_cache), (v[keep], v_cache)):
        rows = cache.view(-1, num_kv_heads, head_dim)
        if cache.dtype == torch.float8_e4m3fn:
            # saturated like the kernels' conversion (torch's gives NaN past 448); the CPU has
            # no fp8 index_copy_, so the bytes are copied
            fp8 = new.float().clamp(-FP8_MAX, FP8_MAX).to(cache.dtype)
            rows.view(torch.uint8).index_copy_(0, slots, fp8.view(torch.uint8))
        else:
            rows.index_copy_(0, slots, new.to(cache.dtype))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of the new tokens over each request's paged context.

    Covers prefill, chunked prefill on top of a cached prefix, and decode in one op.
    Decode rows (one new token) are gathered and attended as one padded batch; each prefill
    chunk is attended on its own, so no request pays for another's length.
    q: [T, Hq, D] -> [T, Hq, D].
    """
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    gqa = num_heads != num_kv_heads
    keys = k_cache.view(-1, num_kv_heads, head_dim)
    values = v_cache.view(-1, num_kv_heads, head_dim)
    plan = _reference_plan(md, q.device)
    out = torch.empty_like(q)
    if plan.decode_rows is not None:
        k = keys[plan.decode_slots].to(q.dtype).transpose(1, 2)  # [B, Hkv, S, D]
        v = values[plan.decode_slots].to(q.dtype).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q[plan.decode_rows].unsqueeze(2), k, v, attn_mask=plan.decode_mask, scale=scale, enable_gqa=gqa
        )
        out[plan.decode_rows] = o.squeeze(2)
    for chunk in plan.prefill:
        k = keys[chunk.slots].to(q.dtype).transpose(0, 1).unsqueeze(0)  # [1, Hkv, S, D]
        v = values[chunk.slots].to(q.dtype).transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(
            q[chunk.rows].transpose(0, 1).unsqueeze(0), k, v,
            attn_mask=chunk.mask, is_causal=chunk.mask is None, scale=scale, enable_gqa=gqa,
        )
        out[chunk.rows] = o.squeeze(0).transpose(0, 1)
    return out


class _PrefillChunk:
    def __init__(self, rows: slice, slots: torch.Tensor, mask: torch.Tensor | None) -> None:
        self.rows = rows  # the chunk's query rows
        self.slots = slots  # [S]: cache slot of each context position
        self.mask = mask  # [Q, S] causal mask offset by the cached prefix; None: plain causal


class _ReferencePlan:
    """Index tensors shared by every layer of one step (built once, cached in md.scratch).

    Positions past a decode row's length are pointed at its first slot rather than left to
    whatever the cache holds there (NaN, say): a masked weight of 0 times NaN is still NaN.
    """

    def __init__(self, md: AttentionMetadata, device: torch.device) -> None:
        qsl = md.query_start_loc.tolist()
        seq_lens = (md.seq_lens_cpu if md.seq_lens_cpu is not None else md.seq_lens).tolist()
        tables = md.block_tables.to(device=device, dtype=torch.long)
        bs = md.block_size
        decode = [b for b in range(len(seq_lens)) if qsl[b + 1] - qsl[b] == 1]
        self.decode_rows: torch.Tensor | None = None
        if decode:
            idx = torch.tensor(decode, device=device)
            lens = torch.tensor([seq_lens[b] for b in decode], device=device)
            pos = torch.arange(max(seq_lens[b] for b in decode), device=device)
            valid = pos[None, :] < lens[:, None]
            pos = torch.where(valid, pos[None, :], 0)
            self.decode_slots = tables[idx[:, None], pos // bs] * bs + pos % bs  # [B, S]
            self.decode_mask = valid[:, None, None, :]
            self.decode_rows = torch.tensor([qsl[b] for b in decode], device=device)
        self.prefill: list[_PrefillChunk] = []
        for b in range(len(seq_lens)):
            q_len, s_len = qsl[b + 1] - qsl[b], seq_lens[b]
            if q_len == 1:
                continue
            pos = torch.arange(s_len, device=device)
            slots = tables[b, pos // bs] * bs + pos % bs
            mask = None
            if s_len != q_len:
                q_pos = torch.arange(s_len - q_len, s_len, device=device)
                mask = pos[None, :] <= q_pos[:, None]
            self.prefill.append(_PrefillChunk(slice(qsl[b], qsl[b + 1]), slots, mask))


def _reference_plan(md: AttentionMetadata, device: torch.device) -> _ReferencePlan:
    plan = md.scratch.get("reference_plan")
    if plan is None:
        plan = md.scratch["reference_plan"] = _ReferencePlan(md, device)
    assert isinstance(plan, _ReferencePlan)
    return plan
