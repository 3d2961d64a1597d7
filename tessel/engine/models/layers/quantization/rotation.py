"""Rotation (QuaRot, Ashkboos et al. 2024): turn activations by orthogonal matrices so their
outliers spread over every channel before W8A8 quantization; exact in real arithmetic.

``rotate_residual``: each RMSNorm gain is folded into the layers that read its output (a unit-gain
RMSNorm commutes with an orthogonal ``Q``), then the embedding and the layers reading the residual
stream (qkv, gate/up, LM head) become ``W Q`` and those writing it (o, down) ``Q^T W``: free at run
time. ``rotate_down_input``: down_proj's input (the MLP width, where outliers are worst) is turned
online by a Hadamard transform, one small GEMM pair per token and layer. ``Q`` is a Hadamard matrix
with seeded random signs where the size has one (2^k times a Paley order, e.g. 576 = 8 x 72), else
the Q of a seeded Gaussian's QR.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from tessel.engine.models.layers.linear import VocabParallelEmbedding

_ROWS = 8192  # rows turned at a time: a 128k-row embedding in float64 at once would be 4 GiB
_H2 = ((1.0, 1.0), (1.0, -1.0))


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


def _paley(m: int) -> torch.Tensor | None:
    """A +-1 Hadamard matrix of order ``m`` by Paley's constructions over a prime field q, or None:
    I (order q + 1, q = 3 mod 4) and II (order 2(q + 1), q = 1 mod 4)."""
    for q, skew in ((m - 1, True), (m // 2 - 1, False)):
        if not _is_prime(q) or q % 4 != (3 if skew else 1) or (not skew and m % 2):
            continue
        squares = {i * i % q for i in range(1, q)}
        chi = torch.tensor([0.0] + [1.0 if r in squares else -1.0 for r in range(1, q)], dtype=torch.float64)
        idx = torch.arange(q)
        c = torch.zeros(q + 1, q + 1, dtype=torch.float64)  # the conference matrix
        c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, -1.0 if skew else 1.0, chi[(idx[None, :] - idx[:, None]) % q]
        eye = torch.eye(q + 1, dtype=torch.float64)
        if skew:
            return eye + c
        return torch.kron(c, torch.tensor(_H2, dtype=torch.float64)) + torch.kron(
            eye, torch.tensor(((1.0, -1.0), (-1.0, -1.0)), dtype=torch.float64)
        )
    return None


def hadamard_factors(n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(A, B)``, +-1 Hadamard matrices with ``kron(A, B)`` of order n: B Sylvester's of the
    largest power of two that leaves a Paley order (or 1) for A. None when n has no such split."""
    twos = (n & -n).bit_length() - 1
    for k in range(twos, -1, -1):
        a = torch.ones(1, 1, dtype=torch.float64) if n == 2**k else _paley(n // 2**k)
        if a is not None:
            b = torch.ones(1, 1, dtype=torch.float64)
            for _ in range(k):
                b = torch.kron(b, torch.tensor(_H2, dtype=torch.float64))
            return a, b
    return None


def rotation_matrix(n: int, seed: int) -> torch.Tensor:
    """An orthogonal float64 [n, n]: ``diag(random signs) H / sqrt(n)`` where a Hadamard H exists,
    else the Q of a seeded Gaussian's QR (signs fixed so it is unique)."""
    gen = torch.Generator().manual_seed(seed)
    factors = hadamard_factors(n)
    if factors is not None:
        signs = torch.randint(0, 2, (n,), generator=gen).double() * 2 - 1
        return signs[:, None] * torch.kron(*factors) / n**0.5
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))[None, :]


def _times(weight: torch.Tensor, q: torch.Tensor, scale: torch.Tensor | None = None) -> None:
    """``weight <- (weight * scale) q`` in float64, by blocks of rows."""
    q = q.to(weight.device)
    for start in range(0, weight.shape[0], _ROWS):
        rows = weight.data[start : start + _ROWS]
        x = rows.double() if scale is None else rows.double() * scale.double()[None, :]
        rows.copy_(x @ q)


@torch.inference_mode()
def rotate_residual(model: nn.Module, seed: int = 0) -> None:
    """Fold the RMSNorm gains and turn the residual stream; a tied LM head becomes its own."""
    m = cast(Any, model)
    if m.tp.size > 1:  # callers check tensor_parallel_size first; this guards direct use
        raise ValueError("quant_rotation needs tensor_parallel_size=1")
    q = rotation_matrix(m.arch.hidden_size, seed)
    embed = m.model.embed_tokens
    if m.lm_head is None:  # tied: after the fold the head holds the final norm's gain, the embedding not
        with torch.device(embed.weight.device):
            m.lm_head = VocabParallelEmbedding(m.arch.vocab_size, m.arch.hidden_size, m.tp)
        m.lm_head.weight = nn.Parameter(embed.weight.detach().clone(), requires_grad=False)
    _times(embed.weight, q)
    _fold_and_turn(m.model.norm, m.lm_head, q)
    for layer in m.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        _fold_and_turn(layer.input_layernorm, attn.qkv_proj, q)  # q/k/v biases are outputs: unchanged
        _fold_and_turn(layer.post_attention_layernorm, mlp.gate_up_proj, q)
        for out in (attn.o_proj, mlp.down_proj):  # out = x W^T lands in the turned space: Q^T W
            w = out.weight.data
            w.copy_(q.T.to(w.device) @ w.double())


def _fold_and_turn(norm: nn.Module, reader: nn.Module, q: torch.Tensor) -> None:
    gain = norm.get_parameter("weight").data
    _times(reader.get_parameter("weight"), q, gain)
    gain.fill_(1.0)


class HadamardTransform(nn.Module):
    """``x -> x kron(A, B)`` for +-1 factors, as ``A^T X B`` on x viewed [.., a, b]: O(n (a + b))
    per row, not O(n^2); entries +-1 so the transform is exact up to its accumulation."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        # buffers, not parameters: nothing a checkpoint holds
        self.left: torch.Tensor
        self.right: torch.Tensor
        self.register_buffer("left", a.T.contiguous().to(device, dtype), persistent=False)
        self.register_buffer("right", b.to(device, dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.reshape(-1, self.left.shape[0], self.right.shape[0]) @ self.right
        if self.left.shape[0] > 1:
            t = self.left @ t
        return t.reshape(x.shape)


@torch.inference_mode()
def rotate_down_input(model: nn.Module, seed: int = 1) -> None:
    """Turn down_proj's input online by ``diag(s) H``: the signs s fold into the up projection's
    rows (``silu(g) * (u s)``), ``H`` runs per token, and ``W_down <- W_down diag(s) H / n``."""
    m = cast(Any, model)
    n = m.arch.intermediate_size
    factors = hadamard_factors(n)
    if factors is None:
        raise ValueError(
            f"quant_rotation='residual_and_down' needs a Hadamard matrix of intermediate_size {n} "
            "(2^k times a Paley order); use quant_rotation='residual'"
        )
    signs = (torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(seed)).double() * 2 - 1)
    h = torch.kron(*factors)
    for layer in m.model.layers:
        mlp = layer.mlp
        up = mlp.gate_up_proj.weight.data[n:]  # rows [n:] are the up projection
        up.mul_(signs[:, None].to(up))
        if mlp.gate_up_proj.bias is not None:
            mlp.gate_up_proj.bias.data[n:].mul_(signs.to(up))
        _times(mlp.down_proj.weight, signs[:, None] * h / n)
        w = mlp.down_proj.weight
        mlp.down_input_rotation = HadamardTransform(*factors, dtype=w.dtype, device=w.device)
