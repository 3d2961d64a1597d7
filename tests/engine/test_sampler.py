"""The sampler on hand-made logits: each processor against a hand-computed expectation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tessel.engine.request import Request
from tessel.engine.sampler import Sampler, apply_top_k_top_p, draw_keys, process_logits, truncate
from tessel.engine.sampling_metadata import SamplingMetadata, TruncationTensors, check_token_ids
from tessel.engine.sampling_params import SamplingParams, SamplingParamsError

V = 8


def req(
    rid: str = "r",
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    eos: int | None = None,
    **params: Any,
) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=prompt if prompt is not None else [0],
        params=SamplingParams(max_tokens=100, **params),
        max_tokens=100,
        eos_token_id=eos,
        output_token_ids=list(output or []),
    )


def meta(*requests: Request, vocab: int = V) -> SamplingMetadata:
    return SamplingMetadata.build(list(requests), vocab, "cpu")


def draws(logits: torch.Tensor, r: Request, n: int, seed: int = 0) -> torch.Tensor:
    """Sample one row ``n`` times in a single batch of ``n`` identical rows."""
    rows = [Request(f"{i}", r.prompt_token_ids, r.params, 100) for i in range(n)]
    out = Sampler(seed).sample(logits.expand(n, -1).clone(), meta(*rows, vocab=logits.shape[-1]))
    return torch.tensor(out.token_ids)


def test_greedy_takes_argmax() -> None:
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(1))
    out = Sampler().sample(logits.clone(), meta(*[req(temperature=0.0) for _ in range(5)]))
    assert out.token_ids == logits.argmax(-1).tolist() and out.logprobs is None


def test_greedy_and_random_rows_mix() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]).repeat(2, 1)
    logits[1] = torch.tensor([100.0, 0, 0, 0, 0, 0, 0, 0])
    out = Sampler().sample(logits, meta(req(temperature=0.0), req(temperature=1.0)))
    assert out.token_ids == [1, 0]


def test_low_temperature_is_sharp_and_high_is_flat() -> None:
    logits = torch.tensor([1.0, 1.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert (draws(logits, req(temperature=0.01), 500) == 1).all()
    flat = draws(logits, req(temperature=100.0), 4000)
    assert torch.bincount(flat, minlength=V).min() > 4000 / V * 0.8


def test_top_k_keeps_exactly_k() -> None:
    logits = torch.randn(64, generator=torch.Generator().manual_seed(3))
    top3 = set(logits.topk(3).indices.tolist())
    seen = set(draws(logits, req(top_k=3, temperature=5.0), 3000).tolist())
    assert seen == top3


def test_topk_fast_path_matches_the_sort() -> None:
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(4))
    ks = torch.tensor([1, 5, 17, 300, 2, 60])
    fast = truncate(logits, TruncationTensors(torch.arange(6), ks, 300, None))
    assert torch.equal(fast, apply_top_k_top_p(logits, ks, None))
    assert (torch.isfinite(fast).sum(-1) == ks).all()


def test_top_k_and_top_p_together() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    out = apply_top_k_top_p(probs.log(), torch.tensor([1]), torch.tensor([0.9]))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [1]
    out = apply_top_k_top_p(probs.log(), torch.tensor([3]), torch.tensor([0.7]))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [1, 3]


def test_top_p_keeps_the_minimal_nucleus() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    for p, kept in ((0.45, {1}), (0.75, {1, 3}), (0.85, {1, 2, 3}), (1.0, {0, 1, 2, 3})):
        out = apply_top_k_top_p(probs.log(), None, torch.tensor([p]))
        assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == kept, p
        assert torch.equal(out[0][torch.isfinite(out[0])], probs.log()[0][list(sorted(kept))])
    seen = set(draws(probs.log()[0], req(top_p=0.75), 2000).tolist())
    assert seen == {1, 3}


def test_min_p_threshold() -> None:
    probs = torch.tensor([0.5, 0.26, 0.24, 0.0001, 0.0, 0.0, 0.0, 0.0]) + 1e-12
    probs /= probs.sum()
    seen = set(draws(probs.log(), req(min_p=0.5), 3000).tolist())
    assert seen == {0, 1}  # 0.26 >= 0.5 * 0.5 > 0.24


def test_logit_bias_forces_and_bans() -> None:
    logits = torch.zeros(2, V)
    logits[:, 0] = 10.0
    m = meta(
        req(temperature=0.0, logit_bias={5: 100.0}),
        req(temperature=0.0, logit_bias={0: -100.0, 3: 0.5}),
    )
    processed = process_logits(logits.clone(), m)
    expected = logits.clone()
    expected[0, 5] += 100.0
    expected[1, 0] -= 100.0
    expected[1, 3] += 0.5
    assert torch.equal(processed, expected)
    assert Sampler().sample(logits, m).token_ids == [5, 3]


def test_min_tokens_bans_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(3, V)
    logits[:, 2] = 5.0  # eos
    logits[:, 4] = 4.0  # stop id
    logits[:, 6] = 3.0
    rows = [
        req(output=[7], eos=2, min_tokens=2, stop_token_ids=[4], temperature=0.0),  # 1 < 2: banned
        req(output=[7, 7], eos=2, min_tokens=2, stop_token_ids=[4], temperature=0.0),  # reached
        req(output=[], eos=2, min_tokens=1, ignore_eos=True, temperature=0.0),  # eos is no stop
    ]
    processed = process_logits(logits.clone(), meta(*rows))
    assert processed[0, 2] == processed[0, 4] == float("-inf")
    assert torch.equal(processed[1:], logits[1:])
    assert Sampler().sample(logits, meta(*rows)).token_ids == [6, 2, 2]


def test_repetition_penalty_hf_semantics() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0, 0.0, 0.0, 0.0]])
    r = req(prompt=[0, 1], output=[4], repetition_penalty=2.0)
    expected = torch.tensor([[1.0, -4.0, 2.0, -2.0, 0.5, 0.0, 0.0, 0.0]])
    assert torch.equal(process_logits(logits.clone(), meta(r)), expected)


def test_presence_and_frequency_penalties_openai_semantics() -> None:
    logits = torch.zeros(2, V)
    r = req(output=[3, 3, 3, 5], presence_penalty=0.5, frequency_penalty=0.25)
    plain = req(output=[3, 3])
    expected = torch.zeros(2, V)
    expected[0, 3] = -0.5 - 3 * 0.25
    expected[0, 5] = -0.5 - 1 * 0.25
    assert torch.allclose(process_logits(logits.clone(), meta(plain, r)), expected[[1, 0]])


def test_logprobs_from_raw_logits_sorted() -> None:
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5))
    rows = [req(logprobs=3, temperature=0.0, logit_bias={0: 50.0}), req(), req(logprobs=0, top_k=1)]
    out = Sampler().sample(logits.clone(), meta(*rows))
    raw = torch.log_softmax(logits, -1)
    assert out.logprobs is not None and out.logprobs[1] is None
    first, third = out.logprobs[0], out.logprobs[2]
    assert first is not None and third is not None
    assert first.token_id == out.token_ids[0] == 0  # the bias chose it; logprob stays raw
    assert first.logprob == pytest.approx(raw[0, 0].item())
    values, ids = raw[0].topk(3)
    assert [t for t, _ in first.top] == ids.tolist()
    assert [v for _, v in first.top] == pytest.approx(values.tolist())
    assert third.top == [] and third.logprob == pytest.approx(raw[2, out.token_ids[2]].item())


def test_seeded_row_ignores_batch_composition() -> None:
    vocab, steps = 50, 6
    gen = torch.Generator().manual_seed(9)
    logits = [torch.randn(vocab, generator=gen) for _ in range(steps)]

    def run(layout: list[str], engine_seed: int) -> list[int]:
        sampler, picked = Sampler(engine_seed), []
        rows = [req(rid, seed=1234) if rid == "seeded" else req(rid) for rid in layout]
        for step in range(steps):
            batch = torch.stack(
                [logits[step] if rid == "seeded" else torch.randn(vocab) for rid in layout]
            )
            out = sampler.sample(batch, SamplingMetadata.build(rows, vocab, "cpu"))
            picked.append(out.token_ids[layout.index("seeded")])
        return picked

    alone = run(["seeded"], 0)
    assert run(["a", "seeded", "b"], 1) == alone
    assert run(["a", "b", "c", "seeded"], 2) == alone
    assert len(set(alone)) > 1  # really random, not a constant


def test_forget_restarts_the_seeded_stream() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(2))
    sampler, r = Sampler(), req("x", seed=7)
    first = [sampler.sample(logits.clone(), meta(r, vocab=50)).token_ids[0] for _ in range(5)]
    sampler.forget("x")
    again = [sampler.sample(logits.clone(), meta(r, vocab=50)).token_ids[0] for _ in range(5)]
    assert first == again


def test_temperature_one_matches_softmax() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 0.2, 1.5])
    n = 20000
    counts = torch.bincount(draws(logits, req(), n, seed=11), minlength=V).double()
    expected = torch.softmax(logits.double(), -1) * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 24.3  # chi-square, 7 degrees of freedom, p = 0.001


def test_out_of_vocab_ids_rejected_at_admission() -> None:
    check_token_ids(SamplingParams(logit_bias={3: 1.0}, stop_token_ids=[7]), V)
    with pytest.raises(SamplingParamsError, match="logit_bias"):
        check_token_ids(SamplingParams(logit_bias={V: 1.0}), V)
    with pytest.raises(SamplingParamsError, match="stop_token_ids"):
        check_token_ids(SamplingParams(stop_token_ids=[V + 3]), V)


def test_metadata_skips_unused_tensors() -> None:
    m = meta(req(temperature=0.0), req(temperature=0.0))
    assert m.all_greedy and m.temperature is None and m.penalties is None
    assert m.logit_bias is None and m.banned is None and m.max_num_logprobs is None
    m = meta(req(top_k=2), req(presence_penalty=1.0), req(top_p=0.5, temperature=0.0))
    assert m.min_p is None and m.truncation is not None  # the greedy row's top_p is moot
    assert m.truncation.rows.tolist() == [0] and m.truncation.top_p is None
    assert m.truncation.top_k is not None and m.truncation.top_k.tolist() == [2]
    assert m.penalties is not None and m.penalties.rows.tolist() == [1]
    assert m.penalties.repetition is None


def test_zero_mass_tokens_never_win_at_the_vocabulary_edges() -> None:
    """Rows whose only allowed token is the first or the last id (the rest masked to -inf, as
    top-k and logit_bias bans leave them), over many draws: the draw never lands on a masked id."""
    vocab = 1000
    logits = torch.full((4, vocab), float("-inf"))
    logits[0, 0] = logits[1, -1] = 0.0
    logits[2, [0, -1]] = 0.0  # two allowed at the two ends, zeros between them
    logits[3, 500] = 3.0
    for seed in range(50):
        out = Sampler(seed).sample(logits.clone(), meta(*[req(str(i), temperature=1.0) for i in range(4)], vocab=vocab))
        assert out.token_ids[:2] == [0, vocab - 1] and out.token_ids[2] in (0, vocab - 1) and out.token_ids[3] == 500


def test_greedy_argmax_takes_the_first_of_tied_maxima() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 0.0, 0.0, 0.0], [0.0] * 8, [-1.0, -1.0, -2.0, -5, -1, -1, -1, -1]])
    out = Sampler().sample(logits.clone(), meta(*[req(str(i), temperature=0.0) for i in range(3)]))
    assert out.token_ids == torch.argmax(logits, dim=-1).tolist() == [1, 0, 0]


@pytest.mark.parametrize("rows", [1, 2, 3, 8])
def test_draw_keys_start_aligned_at_any_batch(rows: int) -> None:
    """The fused sampler's seed and step rows both start 16-byte aligned whatever the batch, so
    an odd batch does not make Triton compile a kernel apart (kernels/sampling.py)."""
    seeds, steps = list(range(100, 100 + rows)), list(range(rows))
    seed_t, step_t = draw_keys(seeds, steps, torch.device("cpu"))
    assert seed_t.tolist() == seeds and step_t.tolist() == steps
    assert seed_t.data_ptr() % 16 == 0 and step_t.data_ptr() % 16 == 0
