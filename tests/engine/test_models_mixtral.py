"""A tiny random Mixtral checkpoint (``block_sparse_moe.experts.N.w1/w3/w2``, the names transformers
5 ``save_pretrained`` writes): the engine's greedy tokens equal transformers' (CPU, fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from tessel.config.model_arch import ModelArch
from tessel.engine import LLM, SamplingParams
from tests.checkpoints import tiny_tokenizer, write_tiny_checkpoint

PROMPTS = ["The capital of France is", "Hi", "1, 2, 3, 4,", "def fibonacci(n):"]


def test_greedy_matches_transformers(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path, "mixtral")
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    llm = LLM(str(directory), device="cpu", dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    tok = tiny_tokenizer()
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        with torch.inference_mode():
            out = reference.generate(
                torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        got = llm.generate([prompt], params)[0].outputs[0].token_ids
        assert list(got) == out[0, len(ids):].tolist(), prompt


def test_arch_reads_mixtral_config() -> None:
    """Mixtral's expert width is its ``intermediate_size`` and its router always renormalises."""
    arch = ModelArch.from_hf(
        {
            "architectures": ["MixtralForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        }
    )
    assert (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size) == (8, 2, 14336)
    assert arch.norm_topk_prob and not arch.qk_norm
    assert all(arch.is_moe_layer(i) for i in range(32))


def test_shared_experts_refused() -> None:
    hf = {
        "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 10, "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
        "shared_expert_intermediate_size": 16,
    }
    with pytest.raises(ValueError, match="shared_expert_intermediate_size"):
        ModelArch.from_hf(hf)
