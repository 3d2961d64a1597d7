"""Plain-torch mixture-of-experts: a loop over the experts that received tokens (the CPU path
and the fused Triton kernel's twin)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t])`` with each expert a SwiGLU MLP.

    x: [T, H]; w13: [E, 2I, H] (gate rows then up rows); w2: [E, H, I];
    topk_weights / topk_ids: [T, K].
    """
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    flat_ids = topk_ids.reshape(-1)
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_w = topk_weights.reshape(-1)
    for e in torch.unique(flat_ids).tolist():  # only experts with tokens: most are empty at decode
        rows = (flat_ids == e).nonzero(as_tuple=True)[0]
        tokens = token_of[rows]
        h = F.linear(x[tokens], w13[e])
        act = F.silu(h[:, :inter]) * h[:, inter:]
        y = F.linear(act, w2[e]) * flat_w[rows, None].to(x.dtype)
        out.index_add_(0, tokens, y)
    return out


def route_topk(logits: torch.Tensor, top_k: int, renormalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts in fp32, keep the top ``top_k``; ``renormalise`` rescales them to
    sum to 1 (Qwen3-MoE's ``norm_topk_prob``; always on for Mixtral, whose softmax is over the top-k)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
