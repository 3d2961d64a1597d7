"""Loading the mixture-of-experts families: HF directories in transformers' per-expert spelling,
llama.cpp GGUFs with stacked experts, and the real-shape presets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tessel.config import ModelConfig, load_preset
from tessel.config.model_arch import ModelArch
from tessel.engine import LLM, SamplingParams
from tessel.engine.loader import load_checkpoint
from tessel.engine.loader.names import expected_shapes
from tests.checkpoints import write_tiny_checkpoint, write_tiny_gguf


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_moe_directory_has_the_expected_per_expert_tensors(tmp_path: Path, arch: str) -> None:
    """transformers fuses experts in memory but saves them one tensor each, in its own spelling
    per family: the name table must predict every name and shape it writes."""
    ckpt = load_checkpoint(ModelConfig(model=str(write_tiny_checkpoint(tmp_path, arch))))
    got = {name: tuple(t.shape) for name, t in ckpt.weights()}
    assert got == expected_shapes(ckpt.hf_config)
    assert len([n for n in got if ".experts." in n]) == 2 * 8 * 3  # layers x experts x parts


@pytest.mark.parametrize(
    ("name", "total", "active"), [("Qwen3-30B-A3B", 30.5e9, 3.3e9), ("Mixtral-8x7B", 46.7e9, 12.9e9)]
)
def test_moe_presets_have_the_published_parameter_counts(name: str, total: float, active: float) -> None:
    """The model cards' totals (all experts) and per-token active counts (top-k of them) pin the
    shapes: a wrong expert count, width or top-k moves one of them by far more than 2%."""
    hf = load_preset(name)
    arch = ModelArch.from_hf(hf)
    sizes = {n: math.prod(s) for n, s in expected_shapes(hf).items()}
    experts = sum(v for n, v in sizes.items() if ".experts." in n)
    dense = sum(sizes.values()) - experts
    assert dense + experts == pytest.approx(total, rel=0.02)
    assert dense + experts * arch.num_experts_per_tok / arch.num_experts == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_gguf_moe_round_trip_unstacks_experts(tmp_path: Path, arch: str) -> None:
    """llama.cpp stacks a layer's experts in ``blk.N.ffn_{gate,up,down}_exps`` [E, ...] and names
    the router ``ffn_gate_inp``: loading splits them back into the HF file's per-expert tensors
    (Mixtral's q/k un-permuted too), and the engine on the GGUF generates what it does on the HF
    directory."""
    # Qwen3-MoE: llama.cpp normalises the top-k (no GGUF key says otherwise); Mixtral always does
    directory = write_tiny_checkpoint(tmp_path, arch, **({"norm_topk_prob": True} if arch == "qwen3_moe" else {}))
    path = write_tiny_gguf(directory, tmp_path / "tiny-moe.F32.gguf")
    ckpt = load_checkpoint(ModelConfig(model=str(path), cache_dir=str(tmp_path / "cache")))
    hf_arch = {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}[arch]
    assert ckpt.hf_config["architectures"] == [hf_arch]
    arch_of = ModelArch.from_hf(ckpt.hf_config)
    assert (arch_of.num_experts, arch_of.num_experts_per_tok, arch_of.moe_intermediate_size) == (8, 2, 32)
    assert arch_of.norm_topk_prob and all(arch_of.is_moe_layer(i) for i in range(2))
    got = dict(ckpt.weights())
    reference = load_file(directory / "model.safetensors")
    assert sorted(got) == sorted(reference)
    for name, tensor in reference.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=name)
    prompts = [[5, 17, 33, 90], [100, 3, 7]]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in LLM(str(directory), device="cpu").generate(prompts, greedy)]
    llm = LLM(str(path), device="cpu", cache_dir=str(tmp_path / "cache"))
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == expected
