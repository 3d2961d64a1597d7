"""Greedy outputs equal transformers' token for token, whatever the batching does.

Requests arrive at staggered steps into one continuous batch; the same holds with prefix-cache
hits, with a long prompt prefilled in chunks, and with a KV cache so small that requests are
preempted and recomputed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from tessel.config import ModelConfig
from tessel.engine import LLM, SamplingParams
from tessel.engine.loader import load_checkpoint
from tests.checkpoints import write_tiny_checkpoint

MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Hi",
    "Write a short poem about the sea and the wind that moves across it at night.",
    "1, 2, 3, 4,",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "def fibonacci(n):",
    "Translate to French: I would like a cup of coffee, please.",
    "The three primary colours are",
]
SHARED = (
    "You are a careful assistant. Answer in one sentence, using plain words, and never invent "
    "facts you are unsure of. "
)


def hf_greedy(model: torch.nn.Module, prompt_ids: list[int], max_new: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt_ids]), max_new_tokens=max_new, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()


def run_staggered(llm: LLM, prompts: list[list[int]], every: int = 2) -> list[list[int]]:
    """Add one prompt every ``every`` steps while the batch runs; collect each one's tokens."""
    core = llm.core
    tokens: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or core.has_unfinished():
        if pending and step % every == 0:
            i, prompt = pending.pop(0)
            core.add_request(str(i), prompt, GREEDY)
        for out in core.step():
            tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
        step += 1
    stats = core.stats()
    assert stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0
    return [tokens[str(i)] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def default_reference() -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """transformers' Llama with the very weights our GGUF loader produced."""
    ckpt = load_checkpoint(ModelConfig())
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**ckpt.hf_config)).eval()
    missing, _ = model.load_state_dict(dict(ckpt.weights()), strict=False)
    assert set(missing) <= {"lm_head.weight"}  # tied to the embedding
    model.tie_weights()
    assert ckpt.tokenizer is not None
    return model, ckpt.tokenizer


@pytest.fixture(scope="module")
def default_expected(
    default_reference: tuple[torch.nn.Module, transformers.PreTrainedTokenizerFast],
) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts' ids and transformers' greedy tokens, once for the three cases (9 s each)."""
    model, tok = default_reference
    prompts = [tok.encode(p) for p in DEFAULT_PROMPTS]
    return prompts, [hf_greedy(model, p, MAX_TOKENS) for p in prompts]


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, engine_kwargs",
    [
        ("plain", {}),
        ("chunked", {"max_num_batched_tokens": 16}),
        ("preempted", {"num_blocks": 9, "block_size": 4, "max_num_batched_tokens": 64}),
    ],
)
def test_default_model_matches_transformers(
    default_expected: tuple[list[list[int]], list[list[int]]],
    case: str,
    engine_kwargs: dict[str, int],
) -> None:
    prompts, expected = default_expected
    llm = LLM(None, **engine_kwargs)
    got = run_staggered(llm, prompts)
    assert got == expected
    stats = llm.core.stats()
    if case == "preempted":
        assert stats.preemptions_total > 0


@pytest.mark.slow
def test_default_model_prefix_cache_hits_keep_outputs(
    default_reference: tuple[torch.nn.Module, transformers.PreTrainedTokenizerFast],
) -> None:
    model, tok = default_reference
    prompts = [tok.encode(SHARED + q) for q in ("What is rain?", "Why is the sky blue?", "Who wrote Hamlet?")]
    expected = [hf_greedy(model, p, MAX_TOKENS) for p in prompts]
    llm = LLM(None, block_size=4)
    assert run_staggered(llm, prompts, every=3) == expected
    stats = llm.core.stats()
    assert stats.prefix_cache_hits_total >= 2 * (len(tok.encode(SHARED)) // 4 * 4 - 4)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_checkpoint_matches_transformers(tmp_path: Path, arch: str) -> None:
    overrides = {"tie_word_embeddings": True} if arch == "qwen3" else {}
    if arch == "llama":
        overrides = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}
    directory = write_tiny_checkpoint(tmp_path, arch, **overrides)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    g = torch.Generator().manual_seed(1)
    lengths = [1, 3, 5, 9, 16, 17, 30, 47]
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in lengths]
    expected = [hf_greedy(model, p, MAX_TOKENS) for p in prompts]
    for kwargs in ({}, {"max_num_batched_tokens": 8, "block_size": 4}, {"num_blocks": 20, "block_size": 4}):
        llm = LLM(str(directory), **kwargs)
        assert run_staggered(llm, prompts) == expected, kwargs
