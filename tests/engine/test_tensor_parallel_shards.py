"""Each tensor-parallel rank's parameters are exactly its slices of the full weights.

No process group is needed: loading is local to a rank, so every rank's model is built here in
one process and compared with slices cut from transformers' own state dict by hand (q/k/v and
gate/up rows, o_proj/down_proj columns, vocabulary rows with zero padding, KV heads replicated
when there are fewer than ranks, each expert's width for MoE). The model reads the checkpoint through lazy safetensors
slices, as a rank does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tessel.config import load_preset
from tessel.config.model_arch import ModelArch
from tessel.engine.loader.hf import load_hf_checkpoint
from tessel.engine.models.layers.parallel import (
    ParallelRank,
    check_tensor_parallel,
    tensor_parallel_sizes,
)
from tessel.engine.models.registry import build_model
from tests.checkpoints import write_tiny_checkpoint
from tests.engine.test_loader import reference_state_dict

CASES = {
    # name: (arch, config overrides, tensor-parallel size)
    "kv-split": ("llama", {}, 2),  # 4 q heads, 2 KV heads: one KV head per rank
    "kv-replicated": ("llama", {"num_key_value_heads": 1}, 2),  # 1 KV head on both ranks
    "kv-replicated-4": ("llama", {"num_key_value_heads": 2}, 4),  # each KV head on two ranks
    "qkv-bias-padded-vocab": ("qwen2", {"vocab_size": 301}, 2),  # 301 rows: rank 1 pads one
    "qk-norm-tied": ("qwen3", {"tie_word_embeddings": True}, 2),
    "moe-qwen3": ("qwen3_moe", {}, 2),  # every expert's width 32 split 16 / 16, router replicated
    "moe-mixtral": ("mixtral", {}, 4),  # block_sparse_moe.experts.N.w1/w3/w2, width 32 in 4 parts
}


def expected_shard(full: dict[str, torch.Tensor], name: str, cfg: dict, rank: int, size: int) -> torch.Tensor:
    """Our parameter ``name`` on ``rank``, cut from the full HF tensors by the Megatron layout."""
    d, hkv = cfg["head_dim"], cfg["num_key_value_heads"]

    def rows(t: torch.Tensor, parts: int) -> torch.Tensor:
        n = t.shape[0] // parts
        return t[rank * n : (rank + 1) * n]

    def kv_rows(t: torch.Tensor) -> torch.Tensor:
        if hkv >= size:
            return rows(t, size)
        head = rank * hkv // size  # fewer heads than ranks: consecutive ranks share a head
        return t[head * d : (head + 1) * d]

    if name.endswith(".mlp.w13"):  # transformers' own fused [E, 2I, H]: gate rows, then up rows
        fused = full[name.replace(".w13", ".experts.gate_up_proj")]
        gate, up = fused.chunk(2, dim=1)
        return torch.cat([rows(gate.transpose(0, 1), size), rows(up.transpose(0, 1), size)]).transpose(0, 1)
    if name.endswith(".mlp.w2"):  # [E, H, I]: this rank's columns of every expert
        return rows(full[name.replace(".w2", ".experts.down_proj")].transpose(0, 2), size).transpose(0, 2)
    if name.endswith(".mlp.gate"):
        return full[name + ".weight"]
    if "qkv_proj" in name:
        q, k, v = (full[name.replace("qkv_proj", p)] for p in ("q_proj", "k_proj", "v_proj"))
        return torch.cat([rows(q, size), kv_rows(k), kv_rows(v)])
    if "gate_up_proj" in name:
        return torch.cat([rows(full[name.replace("gate_up_proj", p)], size) for p in ("gate_proj", "up_proj")])
    if "o_proj" in name or "down_proj" in name:
        return rows(full[name].T, size).T
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        vocab = full[name].shape[0]
        local = -(-vocab // size)
        padded = torch.zeros(local * size, full[name].shape[1])
        padded[:vocab] = full[name]
        return padded[rank * local : (rank + 1) * local]
    return full[name]  # norms: replicated


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_holds_exactly_its_slices(tmp_path: Path, case: str) -> None:
    arch_name, overrides, size = CASES[case]
    directory = write_tiny_checkpoint(tmp_path, arch_name, **overrides)
    full = reference_state_dict(directory)
    ckpt = load_hf_checkpoint(directory)
    assert ckpt.weight_slices is not None
    arch = ModelArch.from_hf(ckpt.hf_config)
    cfg = {**ckpt.hf_config, "num_key_value_heads": arch.num_key_value_heads, "head_dim": arch.head_dim}
    seen_kv_heads = set()
    for rank in range(size):
        model = build_model(arch, 64, ParallelRank(rank, size))
        model.load_weights(ckpt.weight_slices())
        params = dict(model.named_parameters())
        assert params, case
        for name, param in params.items():
            torch.testing.assert_close(
                param.data, expected_shard(full, name, cfg, rank, size), rtol=0, atol=0,
                msg=lambda m, n=name, r=rank: f"{case} rank {r} {n}: {m}",
            )
        attn = model.model.layers[0].self_attn
        assert attn.num_heads == arch.num_attention_heads // size
        seen_kv_heads.add(model.model.layers[0].self_attn.qkv_proj.source_starts[1])
    # every KV head is held by some rank
    assert len(seen_kv_heads) == min(arch.num_key_value_heads, size)


def test_sizes_that_do_not_divide_are_refused_naming_the_allowed_ones() -> None:
    smollm2 = ModelArch.from_hf(load_preset("SmolLM2-135M"))  # 9 q heads, 3 KV heads, MLP 1536
    assert tensor_parallel_sizes(smollm2, up_to=16) == [1, 3]
    check_tensor_parallel(smollm2, 3)
    with pytest.raises(ValueError, match=r"num_attention_heads=9 is not divisible by 2; allowed sizes: 1, 3"):
        check_tensor_parallel(smollm2, 2)
    llama8b = ModelArch.from_hf(load_preset("Llama-3.1-8B"))  # 32 q heads, 8 KV heads
    assert tensor_parallel_sizes(llama8b, up_to=32) == [1, 2, 4, 8, 16, 32]
    with pytest.raises(ValueError, match="allowed sizes: 1, 2, 4, 8"):
        check_tensor_parallel(llama8b, 3)


def test_moe_expert_width_must_divide() -> None:
    qwen3_moe = ModelArch.from_hf(load_preset("Qwen3-30B-A3B"))  # experts of width 768
    assert 4 in tensor_parallel_sizes(qwen3_moe)
    arch = qwen3_moe.model_copy(update={"moe_intermediate_size": 770})
    with pytest.raises(ValueError, match=r"moe_intermediate_size=770 is not divisible by 4; allowed sizes: 1, 2$"):
        check_tensor_parallel(arch, 4)
