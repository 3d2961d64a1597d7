"""A tiny random Qwen3-MoE checkpoint: the engine's greedy tokens equal transformers' (CPU, fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from tessel.engine import LLM, SamplingParams
from tests.checkpoints import tiny_tokenizer, write_tiny_checkpoint

PROMPTS = ["The capital of France is", "Hi", "1, 2, 3, 4,", "def fibonacci(n):"]


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_greedy_matches_transformers(tmp_path: Path, norm_topk_prob: bool) -> None:
    directory = write_tiny_checkpoint(tmp_path, "qwen3_moe", norm_topk_prob=norm_topk_prob)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    llm = LLM(str(directory), device="cpu", dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    tok = tiny_tokenizer()
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        with torch.inference_mode():
            out = reference.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
        expected = out[0, len(ids):].tolist()
        got = llm.generate([prompt], params)[0].outputs[0].token_ids
        assert list(got) == expected, prompt
