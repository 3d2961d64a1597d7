"""Greedy and temperature sampling in one pass over the logits (Gumbel-max).

``argmax(l / T + G)`` with ``G = -log(-log(U))`` draws from ``softmax(l / T)``; greedy rows take
``argmax(l)``. Each program scans a chunk of one row and keeps its best (value, index); a second,
tiny kernel picks each row's best chunk. The logits are read once, in their own dtype: the torch
path's float copy, temperature division, softmax, noise and argmax are one read here.

The uniforms come from Philox keyed by the row's seed and ``step * V + token``: a request's draw
depends on its seed and how many tokens it has generated, never on its batch neighbours.
Ties go to the lowest token id, as ``torch.argmax`` does, so greedy rows pick what it picks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessel.kernels.checks import FLOAT_DTYPES, check_shape, check_tensor
from tessel.kernels.sampling_types import TemperatureDraws

CHUNK = 4096


@triton.jit
def _chunk_best_kernel(
    logits_ptr, inv_temp_ptr, seed_ptr, step_ptr, best_val_ptr, best_idx_ptr,
    stride_row, vocab, num_chunks,
    RANDOM: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
    if RANDOM:
        inv_t = tl.load(inv_temp_ptr + row)
        if inv_t > 0.0:  # 0 marks a greedy row in a mixed batch
            counter = tl.load(step_ptr + row).to(tl.int64) * vocab + offs
            u = tl.rand(tl.load(seed_ptr + row), counter)
            x = tl.where(mask, x * inv_t - tl.log(-tl.log(u)), float("-inf"))
    val, idx = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(best_val_ptr + row * num_chunks + chunk, val)
    tl.store(best_idx_ptr + row * num_chunks + chunk, chunk * BLOCK + idx)


@triton.jit
def _row_best_kernel(best_val_ptr, best_idx_ptr, out_ptr, num_chunks, CHUNKS_PAD: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, CHUNKS_PAD)
    vals = tl.load(best_val_ptr + row * num_chunks + offs, mask=offs < num_chunks, other=float("-inf"))
    best = tl.argmax(vals, axis=0, tie_break_left=True)
    tl.store(out_ptr + row, tl.load(best_idx_ptr + row * num_chunks + best).to(tl.int64))


def sample_tokens(
    logits: torch.Tensor, draws: TemperatureDraws | None = None
) -> torch.Tensor:
    """Token ids [B] (int64) from logits [B, V]: argmax where ``draws`` is None or a row's
    inverse temperature is 0, else a draw from softmax(logits / T) keyed by (seed, step)."""
    check_tensor("logits", logits, ndim=2, dtypes=FLOAT_DTYPES)
    rows, vocab = logits.shape
    if draws is not None:
        check_tensor("inv_temperature", draws.inv_temperature, dtypes=(torch.float32,))
        for name in ("inv_temperature", "seeds", "steps"):
            t = getattr(draws, name)
            check_tensor(name, t, ndim=1, device=logits.device, dtypes=None if name == "inv_temperature" else (torch.int64,))
            check_shape(name, t, (rows,))
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    chunks = triton.cdiv(vocab, CHUNK)
    best_val = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    best_idx = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    keys = (best_val,) * 3 if draws is None else (draws.inv_temperature, draws.seeds, draws.steps)  # unread when greedy
    _chunk_best_kernel[(rows, chunks)](
        logits, *keys, best_val, best_idx, logits.stride(0), vocab, chunks,
        RANDOM=draws is not None, BLOCK=CHUNK, num_warps=8,
    )
    _row_best_kernel[(rows,)](best_val, best_idx, out, chunks, CHUNKS_PAD=triton.next_power_of_2(chunks), num_warps=1)
    return out
