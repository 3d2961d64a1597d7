"""Tensor parallel on the CPU (gloo, real worker processes): greedy tokens identical to one rank.

Requests arrive staggered into one continuous batch, with chunked prefill, overlap scheduling
(the next step's inputs take rank 0's sampled ids, broadcast to every worker), and logprobs and
echo scoring (logits gathered from every rank's vocabulary slice). Checkpoints: a tiny one
whose KV heads split across 2 ranks, one with fewer KV heads than ranks (replicated), and the
default model at 3 ranks (its 9 query heads do not divide by 2); and the two MoE families, each
expert's width split across the ranks.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tessel.engine import LLM, SamplingParams
from tests.checkpoints import write_tiny_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
SCORED = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=3, prompt_logprobs=2)
PROMPTS = [[5, 17, 33, 90, 41, 7], [100, 3], list(range(3, 60)), [250, 251, 252, 9, 9, 9, 9], [42]]
ENGINE = {"block_size": 4, "num_blocks": 128, "max_num_batched_tokens": 24}  # 57 tokens: chunked


def run(llm: LLM, prompts: list[list[int]] | list[str], every: int = 2) -> list[list[int]]:
    """Add one prompt every ``every`` steps while the batch runs; each one's greedy tokens."""
    core, tokens, pending, step = llm.core, {}, list(enumerate(prompts)), 0
    while pending or core.has_unfinished():
        if pending and step % every == 0:
            i, prompt = pending.pop(0)
            core.add_request(str(i), prompt, GREEDY)
        for out in core.step():
            tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
        step += 1
    assert core.stats().kv_blocks_used == 0
    return [tokens[str(i)] for i in range(len(prompts))]


def assert_same_logprobs(a: list, b: list) -> None:  # type: ignore[type-arg]
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            assert x is None and y is None
            continue
        assert x.token_id == y.token_id and math.isclose(x.logprob, y.logprob, abs_tol=1e-4)
        assert [t for t, _ in x.top] == [t for t, _ in y.top]


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv-split", "kv-replicated"])
def test_tp2_equals_tp1(tmp_path: Path, kv_heads: int) -> None:
    directory = str(write_tiny_checkpoint(tmp_path, "llama", num_key_value_heads=kv_heads))
    single = LLM(directory, **ENGINE)
    expected = run(single, PROMPTS)
    scored = single.generate([PROMPTS[2]], SCORED)[0]
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        assert run(llm, PROMPTS) == expected
        got = llm.generate([PROMPTS[2]], SCORED)[0]
        stats = llm.core.stats()
    assert got.outputs[0].token_ids == scored.outputs[0].token_ids
    assert_same_logprobs(got.outputs[0].logprobs or [], scored.outputs[0].logprobs or [])
    assert_same_logprobs(got.prompt_logprobs or [], scored.prompt_logprobs or [])
    assert stats.tensor_parallel_size == 2
    # K and V x 2 layers x 4 tokens x heads on a rank x 16 dims x 4 bytes, per block and rank
    heads_per_rank = max(1, kv_heads // 2)
    assert stats.kv_cache_bytes == 128 * (2 * 2 * 4 * heads_per_rank * 16 * 4) * 2


def test_tp2_equals_tp1_with_an_fp8_kv_cache(tmp_path: Path) -> None:
    """kv_cache_dtype=fp8 reaches the workers: each rank's cache slice is E4M3 (a quarter of the
    fp32 bytes) and the tokens are one rank's with the same cache."""
    directory = str(write_tiny_checkpoint(tmp_path, "llama"))
    engine = {**ENGINE, "kv_cache_dtype": "fp8"}
    expected = run(LLM(directory, **engine), PROMPTS)
    with LLM(directory, tensor_parallel_size=2, **engine) as llm:
        assert run(llm, PROMPTS) == expected
        stats = llm.core.stats()
    assert stats.kv_cache_bytes == 128 * (2 * 2 * 4 * 1 * 16 * 1) * 2  # one KV head a rank, 1 byte


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_moe_tp2_equals_tp1(tmp_path: Path, arch: str) -> None:
    """Each rank holds half of every expert's width: without the all-reduce after the experts
    each rank would sample from half an MLP. Rank 0 alone reports the routing, as one rank does."""
    directory = str(write_tiny_checkpoint(tmp_path, arch))
    single = LLM(directory, **ENGINE)
    expected = run(single, PROMPTS)
    with LLM(directory, tensor_parallel_size=2, **ENGINE) as llm:
        assert run(llm, PROMPTS) == expected
        routed = llm.core.stats().expert_tokens_total
    assert routed == single.core.stats().expert_tokens_total and sum(routed) > 0


@pytest.mark.slow
def test_default_model_tp3_equals_tp1() -> None:
    """SmolLM2-135M: 9 query heads and 3 KV heads split 3 ways (TP=2 cannot divide 9 heads)."""
    prompts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]
    kw = {"num_blocks": 64, "max_num_batched_tokens": 64}
    expected = run(LLM(None, **kw), prompts, every=1)
    with LLM(None, tensor_parallel_size=3, **kw) as llm:
        assert run(llm, prompts, every=1) == expected


def test_default_model_refuses_tp2_naming_the_sizes_that_fit() -> None:
    with pytest.raises(ValueError, match=r"num_attention_heads=9 is not divisible by 2; allowed sizes: 1, 3"):
        LLM(None, tensor_parallel_size=2)
