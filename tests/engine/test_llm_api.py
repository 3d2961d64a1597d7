"""The offline API end to end on a tiny checkpoint: seeds, n > 1, stops, logprobs, echo scoring."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers

from tessel.engine import LLM, SamplingParams
from tests.checkpoints import write_tiny_checkpoint

PROMPT = [5, 17, 33, 2 + 40, 8, 99, 120, 7, 64, 3, 11, 12, 13, 14, 15, 16, 17, 18]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LLM]:
    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), "llama")
    return directory, LLM(str(directory), block_size=4)


def test_seeded_request_is_the_same_whatever_the_batch(tiny: tuple[Path, LLM]) -> None:
    _, llm = tiny
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=1234, ignore_eos=True)
    alone = llm.generate([PROMPT], seeded)[0].outputs[0].token_ids
    others = SamplingParams(temperature=0.7, max_tokens=5, ignore_eos=True)
    batch = llm.generate([[9, 9, 9], PROMPT, [1, 2, 3, 4, 5]], [others, seeded, others])
    assert batch[1].outputs[0].token_ids == alone
    unseeded = [llm.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0] for _ in range(3)]
    assert len({tuple(o.outputs[0].token_ids) for o in unseeded}) > 1  # really random without a seed


def test_n_choices_share_the_prompt_blocks(tiny: tuple[Path, LLM]) -> None:
    _, llm = tiny
    before = llm.core.stats().prefix_cache_hits_total
    out = llm.generate([PROMPT], SamplingParams(n=3, max_tokens=6, seed=7, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 6 for c in out.outputs)
    # the two later children took the prompt's full blocks from the first child's KV
    assert llm.core.stats().prefix_cache_hits_total - before >= 2 * (len(PROMPT) - 1) // 4 * 4
    assert llm.core.stats().kv_blocks_used == 0


def test_stop_token_and_length(tiny: tuple[Path, LLM]) -> None:
    _, llm = tiny
    greedy = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    tokens = greedy.outputs[0].token_ids
    assert greedy.outputs[0].finish_reason == "length" and len(tokens) == 8
    stop_at = tokens[3]
    stopped = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop_at], ignore_eos=True))[0]
    first = tokens.index(stop_at)
    assert stopped.outputs[0].token_ids == tokens[: first + 1]
    assert stopped.outputs[0].finish_reason == "stop" and stopped.outputs[0].stop_reason == stop_at


def test_logprobs_and_echo_scoring_match_transformers(tiny: tuple[Path, LLM]) -> None:
    directory, llm = tiny
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.inference_mode():
        ref = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=2))[0]
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    for i, lp in enumerate(out.prompt_logprobs[1:], start=1):
        assert lp is not None and lp.token_id == PROMPT[i]
        assert math.isclose(lp.logprob, ref[i - 1, PROMPT[i]].item(), abs_tol=1e-4)
        assert [t for t, _ in lp.top] == ref[i - 1].topk(2).indices.tolist()
    sampled = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, logprobs=3))[0]
    lp = sampled.outputs[0].logprobs
    assert lp is not None and lp[0].token_id == sampled.outputs[0].token_ids[0]
    assert math.isclose(lp[0].logprob, ref[-1].max().item(), abs_tol=1e-4)
    assert [t for t, _ in lp[0].top] == ref[-1].topk(3).indices.tolist()
