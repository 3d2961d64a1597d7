"""Per-step expert routing counts reach ``EngineStats``: equal, expert by expert, to the routing
transformers' own router gives the same prompts, and absent for a dense model."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tessel.engine import LLM, SamplingParams
from tessel.engine.stats import ExpertLoadStats
from tests.checkpoints import tiny_tokenizer, write_tiny_checkpoint

PROMPTS = ["The capital of France is", "Hi", "1, 2, 3, 4,", "def fibonacci(n):"]
EXPERTS, TOP_K, LAYERS = 8, 2, 2  # tests/checkpoints.py's tiny qwen3_moe


def reference_counts(directory: Path, prompts: list[str]) -> list[int]:
    """Tokens per expert, summed over layers, from transformers' router logits on each prompt."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    counts = torch.zeros(EXPERTS, dtype=torch.long)
    for prompt in prompts:
        ids = torch.tensor([tiny_tokenizer()(prompt)["input_ids"]])
        with torch.inference_mode():
            out = model(ids, output_router_logits=True)
        for logits in out.router_logits:  # one [tokens, experts] per MoE layer
            counts += torch.bincount(logits.topk(TOP_K, dim=-1).indices.reshape(-1), minlength=EXPERTS)
    return counts.tolist()


def test_prefill_counts_equal_transformers_routing(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path, "qwen3_moe")
    # no overlap: it would launch a decode step before seeing that max_tokens=1 is reached
    llm = LLM(str(directory), device="cpu", dtype="float32", overlap_scheduling=False)
    assert llm.core.stats().expert_tokens_total == (0,) * EXPERTS  # warm-up forwards not counted
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=1))  # prefill only
    stats = llm.core.stats()
    assert list(stats.expert_tokens_total) == reference_counts(directory, PROMPTS)
    prompt_tokens = sum(len(tiny_tokenizer()(p)["input_ids"]) for p in PROMPTS)
    assert sum(stats.expert_tokens_total) == prompt_tokens * TOP_K * LAYERS
    assert 1.0 <= stats.expert_load_imbalance <= EXPERTS / TOP_K


def test_decode_steps_count_every_computed_token(tmp_path: Path) -> None:
    llm = LLM(str(write_tiny_checkpoint(tmp_path, "qwen3_moe")), device="cpu", dtype="float32")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    # every prompt token once, every sampled token but the last fed back once, and the tokens
    # overlap scheduling computed for requests that had already stopped (routed all the same)
    stats = llm.core.stats()
    computed = sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) - 1 for o in outs)
    assert stats.wasted_tokens_total > 0  # overlap is on: the last term is really tested
    assert sum(stats.expert_tokens_total) == (computed + stats.wasted_tokens_total) * TOP_K * LAYERS


def test_dense_model_reports_no_experts(tmp_path: Path) -> None:
    llm = LLM(str(write_tiny_checkpoint(tmp_path, "llama")), device="cpu", dtype="float32")
    llm.generate(["Hi"], SamplingParams(max_tokens=2))
    stats = llm.core.stats()
    assert stats.expert_tokens_total == () and stats.expert_load_imbalance == 0.0


def test_imbalance_is_the_worst_layer() -> None:
    stats = ExpertLoadStats(4)
    stats.record([[2, 2, 2, 2], [8, 0, 0, 0]])  # even, then all on expert 0
    assert stats.tokens_total == [10, 2, 2, 2] and stats.last_imbalance == 4.0
    stats.record([[1, 1, 1, 1]])
    assert stats.tokens_total == [11, 3, 3, 3] and stats.last_imbalance == 1.0
