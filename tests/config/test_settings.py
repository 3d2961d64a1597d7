"""Settings validate once, with errors naming the field; presets parse into real shapes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tessel.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    list_presets,
    load_preset,
)
from tessel.config.model_arch import ModelArch


def test_presets_cover_the_required_shapes() -> None:
    assert {"SmolLM2-135M", "Llama-3.2-1B", "Llama-3.1-8B", "Qwen3-0.6B", "Qwen3-8B"} <= set(list_presets())
    assert {"Qwen3-30B-A3B", "Mixtral-8x7B"} <= set(list_presets())


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_parses(name: str) -> None:
    arch = ModelArch.from_hf(load_preset(name))
    assert arch.num_attention_heads % arch.num_key_value_heads == 0
    assert arch.hidden_size > 0 and arch.head_dim in (64, 128)


def test_known_preset_facts() -> None:
    llama8b = ModelArch.from_hf(load_preset("Llama-3.1-8B"))
    assert (llama8b.num_hidden_layers, llama8b.num_key_value_heads, llama8b.head_dim) == (32, 8, 128)
    assert llama8b.rope_scaling is not None and llama8b.rope_scaling.rope_type == "llama3"
    qwen3 = ModelArch.from_hf(load_preset("Qwen3-0.6B"))
    assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.tie_word_embeddings
    smol = ModelArch.from_hf(load_preset("SmolLM2-135M"))
    assert (smol.hidden_size, smol.num_attention_heads, smol.num_key_value_heads) == (576, 9, 3)


def test_qwen2_has_qkv_bias_and_rope_parameters_form_is_read() -> None:
    arch = ModelArch.from_hf(
        {
            "architectures": ["Qwen2ForCausalLM"], "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1234.0},
        }
    )
    assert arch.qkv_bias and arch.rope_theta == 1234.0 and arch.num_key_value_heads == 2


def test_unknown_architecture_is_named() -> None:
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ModelArch.from_hf({"architectures": ["GPT2LMHeadModel"]})


def test_configs_are_frozen_and_checked() -> None:
    cfg = EngineConfig()
    with pytest.raises(ValidationError):
        cfg.cache.block_size = 32  # type: ignore[misc]
    with pytest.raises(ValidationError, match="block_size"):
        CacheConfig(block_size=0)
    with pytest.raises(ValidationError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValidationError, match="unknown_field|extra"):
        ModelConfig(unknown_field=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="chunked prefill"):
        EngineConfig(
            model=ModelConfig(max_model_len=4096),
            scheduler=SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=1024),
        )
