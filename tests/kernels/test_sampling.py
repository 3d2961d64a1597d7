"""One-pass sampling (Gumbel-max) against torch: greedy rows equal argmax, draws follow softmax."""

from __future__ import annotations

import pytest
import torch

from tessel.kernels import reference
from tessel.kernels.sampling import CHUNK, sample_tokens
from tessel.kernels.sampling_types import TemperatureDraws as Draws


def _dtypes(device: str) -> list[torch.dtype]:
    return [torch.bfloat16, torch.float32] if device == "cuda" else [torch.float32, torch.float16]


@pytest.mark.parametrize("vocab", [100, CHUNK, 2 * CHUNK + 37])
def test_greedy_equals_argmax_ties_included(device: str, vocab: int) -> None:
    """Ties (inside a chunk and across chunks) go to the lowest id, as torch.argmax does."""
    for dtype in _dtypes(device):
        logits = torch.randn(4, vocab).to(device=device, dtype=dtype)
        logits[1, [3, vocab - 1]] = 50.0  # tie across chunks when vocab spans several
        logits[2, :] = 1.0  # all equal: token 0
        logits[3, vocab // 2] = float("inf")
        got = sample_tokens(logits)
        assert got.dtype == torch.int64
        assert got.tolist() == logits.float().argmax(dim=-1).tolist()
        assert got.tolist()[1:3] == [3, 0]


def test_draws_follow_softmax_and_depend_only_on_seed_and_step(device: str) -> None:
    vocab, rows = 8, 4096 if device == "cuda" else 1024
    base = torch.randn(vocab, generator=torch.Generator().manual_seed(0))
    logits = base.expand(rows, vocab).contiguous().to(device)
    inv_t = torch.full((rows,), 1 / 0.7, device=device)
    steps = torch.arange(rows, device=device)
    seeds = torch.full((rows,), 1234, dtype=torch.int64, device=device)
    drawn = sample_tokens(logits, Draws(inv_t, seeds, steps))
    freq = torch.bincount(drawn.cpu(), minlength=vocab).double() / rows
    want = torch.softmax(base.double() / 0.7, dim=0)
    # binomial standard error at n=1024 is <= 0.016: over 3 sigma (and the draws are fixed by the seeds)
    assert (freq - want).abs().max() < 0.05, (freq, want)
    # The same (seed, step) at another row, with other rows around it: the same token. 128 rows
    # show it as well as all of them, and the interpreter pays per row (a minute for 2 x 1024).
    few = 128
    perm = torch.randperm(rows, device=device)[:few]
    again = sample_tokens(logits[:few], Draws(inv_t[:few], seeds[:few], steps[perm]))
    assert torch.equal(again, drawn[perm])
    # Another seed gives other draws.
    other = sample_tokens(logits[:few], Draws(inv_t[:few], seeds[:few] + 1, steps[:few]))
    assert not torch.equal(other, drawn[:few])


def test_greedy_rows_in_a_random_batch(device: str) -> None:
    logits = torch.randn(3, 1000).to(device)
    inv_t = torch.tensor([0.0, 1.0, 0.0], device=device)
    ids = torch.tensor([5, 6, 7], device=device)
    got = sample_tokens(logits, Draws(inv_t, ids, ids))
    want = logits.argmax(dim=-1)
    assert got[0] == want[0] and got[2] == want[2]


def test_reference_matches_the_kernel_on_greedy_rows() -> None:
    logits = torch.randn(5, 300)
    assert torch.equal(reference.sample_tokens(logits), logits.argmax(dim=-1))


def test_sample_tokens_names_bad_arguments() -> None:
    logits = torch.randn(2, 10)
    ids2, ids3 = torch.ones(2, dtype=torch.long), torch.ones(3, dtype=torch.long)
    with pytest.raises(ValueError, match="seeds"):
        sample_tokens(logits, Draws(torch.ones(2), ids2.int(), ids2))
    with pytest.raises(ValueError, match="inv_temperature"):
        sample_tokens(logits, Draws(torch.ones(2, dtype=torch.float64), ids2, ids2))
    with pytest.raises(ValueError, match="inv_temperature"):
        sample_tokens(logits, Draws(torch.ones(3), ids3, ids3))
