"""W8A8 in the engine: which layers get quantized, compressed-tensors checkpoints, SmoothQuant's
and rotation's folding, and the errors for what is not supported. Tiny random checkpoints, CPU reference path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tessel.config import ModelConfig
from tessel.config.quantization import QUANTIZED_LAYERS, UNQUANTIZED_LAYERS
from tessel.engine import LLM, SamplingParams
from tessel.engine.llm import engine_config_from_kwargs
from tessel.engine.loader import CheckpointError
from tessel.engine.models.layers.quantization.calibration import prefill_hidden
from tessel.engine.models.layers.quantization.rotation import (
    hadamard_factors,
    rotate_down_input,
    rotate_residual,
    rotation_matrix,
)
from tessel.engine.models.layers.quantization.smoothquant import smooth_model
from tessel.kernels.quant import reference as quant_reference
from tests.checkpoints import write_tiny_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = [[5, 17, 33, 90, 41, 7], [100, 3], list(range(3, 60))]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INT8_GROUP = {
    "targets": ["Linear"],
    "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
    "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
    "output_activations": None,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("quant"), "llama")


def model_of(llm: LLM) -> torch.nn.Module:
    return llm.core.runner.model


def generate(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_only_the_configured_layers_are_quantized(tiny: Path) -> None:
    plain, quant = model_of(LLM(str(tiny), num_blocks=32)), model_of(LLM(str(tiny), num_blocks=32, quantization="int8"))
    plain_params = dict(plain.named_parameters())
    quantized = set()
    for name, param in quant.named_parameters():
        module, _, kind = name.rpartition(".")
        leaf = module.rpartition(".")[2]
        if leaf in QUANTIZED_LAYERS:
            quantized.add(module)
            if kind == "weight":
                assert param.dtype == torch.int8, name
                q = quant_reference.quantize_rows(plain_params[name], torch.int8)
                assert torch.equal(param, q.data), name  # per output channel, from the float weight
            else:
                assert kind == "weight_scale" and param.shape == (param.shape[0], 1), name
        else:
            assert leaf in UNQUANTIZED_LAYERS, name
            assert torch.equal(param, plain_params[name]), name  # embedding, lm_head, norms: untouched
    assert len(quantized) == 4 * 2  # qkv, o, gate_up, down in both layers


def _write_compressed(src: Path, dst: Path, ignore: list[str]) -> dict[str, torch.Tensor]:
    """``src``'s model re-saved the way llm-compressor saves W8A8-Dynamic-Per-Token: int8
    ``weight`` + ``weight_scale`` [out, 1] per Linear (float for ignored ones), plus all-zero
    zero points as some exports store; returns the tensors written."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    state = load_file(src / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rpartition(".")[2] in LINEARS and module not in ignore:
            q = quant_reference.quantize_rows(tensor, torch.int8)
            out[name], out[f"{module}.weight_scale"] = q.data, q.scale
            out[f"{module}.weight_zero_point"] = torch.zeros_like(q.scale, dtype=torch.int8)
        else:
            out[name] = tensor
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": INT8_GROUP}, "ignore": ["lm_head", *ignore], "kv_cache_scheme": None,
    }
    (dst / "config.json").write_text(json.dumps(config))
    return out


def test_compressed_tensors_checkpoint_loads_as_stored(tiny: Path, tmp_path: Path) -> None:
    stored = _write_compressed(tiny, tmp_path / "w8a8", ignore=["model.layers.1.mlp.down_proj"])
    llm = LLM(str(tmp_path / "w8a8"), num_blocks=32)  # no flag: the checkpoint says int8
    params = dict(model_of(llm).named_parameters())
    p = "model.layers.0."
    fused_qkv = torch.cat([stored[f"{p}self_attn.{x}_proj.weight"] for x in "qkv"])
    assert torch.equal(params[p + "self_attn.qkv_proj.weight"], fused_qkv)
    scales = torch.cat([stored[f"{p}self_attn.{x}_proj.weight_scale"] for x in "qkv"])
    assert torch.equal(params[p + "self_attn.qkv_proj.weight_scale"], scales)
    assert params["model.layers.1.mlp.down_proj.weight"].dtype == torch.float32  # on the ignore list
    assert "model.layers.1.mlp.down_proj.weight_scale" not in params
    # the same int8 weights and scales as quantizing the float checkpoint at load time
    reference = LLM(str(tiny), num_blocks=32, quantization="int8")
    model_of(reference).model.layers[1].mlp.down_proj = model_of(llm).model.layers[1].mlp.down_proj
    assert generate(llm) == generate(reference)


def test_checkpoint_quantization_errors_name_the_problem(tiny: Path, tmp_path: Path) -> None:
    _write_compressed(tiny, tmp_path / "w8a8", ignore=[])
    with pytest.raises(ValueError, match="already int8"):
        LLM(str(tmp_path / "w8a8"), num_blocks=8, quantization="fp8")
    with pytest.raises(ValueError, match="smoothquant_alpha applies to load-time"):
        LLM(str(tmp_path / "w8a8"), num_blocks=8, quantization="int8", smoothquant_alpha=0.5)
    with pytest.raises(ValueError, match="quant_rotation applies to load-time"):
        LLM(str(tmp_path / "w8a8"), num_blocks=8, quantization="int8", quant_rotation="residual")
    with pytest.raises(ValueError, match="quant_gptq applies to load-time"):
        LLM(str(tmp_path / "w8a8"), num_blocks=8, quantization="int8", quant_gptq=True)
    config_path = tmp_path / "w8a8" / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="'strategy': 'tensor'"):
        LLM(str(tmp_path / "w8a8"), num_blocks=8)
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="quant_method='gptq' is not supported"):
        LLM(str(tmp_path / "w8a8"), num_blocks=8)
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": INT8_GROUP},
        "ignore": ["model.layers.0.self_attn.k_proj"],
    }
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="fuses into one layer"):
        LLM(str(tmp_path / "w8a8"), num_blocks=8)


def test_fp8_on_the_cpu_is_a_clear_error(tiny: Path) -> None:
    with pytest.raises(ValueError, match="fp8.*compute capability >= 8.9.*runs on cpu"):
        LLM(str(tiny), num_blocks=8, quantization="fp8")


def test_smoothquant_folding_keeps_the_float_model(tiny: Path) -> None:
    """Smoothing alone is an identity up to float rounding; it does move scale into the weights."""
    model = model_of(LLM(str(tiny), num_blocks=32))
    ids = PROMPTS[2]
    before = model.compute_logits(prefill_hidden(model, ids))
    norm_before = model.model.layers[0].input_layernorm.weight.clone()
    smooth_model(model, [PROMPTS[0], PROMPTS[1]], alpha=0.5)
    after = model.compute_logits(prefill_hidden(model, ids))
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(model.model.layers[0].input_layernorm.weight, norm_before)


@pytest.mark.parametrize("n", [2, 4, 12, 20, 28, 36, 48, 576, 1536, 3584, 4864, 14336])
def test_hadamard_factors_are_hadamard(n: int) -> None:
    """Sylvester x Paley I (q = 3 mod 4) or II (q = 1 mod 4): +-1 entries, ``H H^T = n I``."""
    factors = hadamard_factors(n)
    assert factors is not None
    assert factors[0].shape[0] * factors[1].shape[0] == n
    for f in factors:
        order = f.shape[0]
        assert f.shape == (order, order) and bool((f.abs() == 1).all())
        assert torch.equal(f @ f.T, order * torch.eye(order, dtype=torch.float64))
    # kron(A, B) kron(A, B)^T = kron(A A^T, B B^T), so the factors settle it; the whole product
    # is checked too where its n^3 matmul is cheap (14336's took 99 s of CI's 2 cores).
    if n <= 4864:
        h = torch.kron(*factors)
        assert h.shape == (n, n) and bool((h.abs() == 1).all())
        assert torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))


def test_rotation_matrix_is_orthogonal_and_seeded() -> None:
    assert hadamard_factors(50) is None and hadamard_factors(9) is None  # 50: the seeded QR instead
    for n in (50, 576):
        q = rotation_matrix(n, seed=3)
        torch.testing.assert_close(q @ q.T, torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-12)
        assert torch.equal(q, rotation_matrix(n, seed=3)) and not torch.equal(q, rotation_matrix(n, seed=4))


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("llama", {"tie_word_embeddings": True, "hidden_size": 48, "intermediate_size": 96}),  # 12 x 4, 12 x 8
        ("qwen2", {"hidden_size": 50}),  # no Hadamard of order 50: a random orthogonal; q/k/v biases
    ],
)
def test_rotation_keeps_the_float_model(tmp_path: Path, arch: str, overrides: dict[str, object]) -> None:
    """Rotating the residual stream and down_proj's input is exact in real arithmetic: fp32 logits
    stay within rounding; the gains are folded (ones) and a tied head becomes its own."""
    model = model_of(LLM(str(write_tiny_checkpoint(tmp_path, arch, **overrides)), num_blocks=32))
    ids = PROMPTS[2]
    before = model.compute_logits(prefill_hidden(model, ids))
    embedding = model.model.embed_tokens.weight.clone()
    rotate_residual(model)
    rotate_down_input(model)
    model.pack_cpu_weights()  # the oneDNN copies of the turned weights, as after quantize_model
    after = model.compute_logits(prefill_hidden(model, ids))
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    assert model.lm_head is not None and model.head is model.lm_head
    assert not torch.allclose(model.model.embed_tokens.weight, embedding)
    for name, param in model.named_parameters():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            assert torch.equal(param, torch.ones_like(param)), name


def test_rotation_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="quant_rotation needs quantization set"):
        ModelConfig(quant_rotation="residual")
    with pytest.raises(ValueError, match="quant_rotation needs tensor_parallel_size=1"):
        engine_config_from_kwargs(None, quantization="int8", quant_rotation="residual", tensor_parallel_size=2)
    odd = write_tiny_checkpoint(tmp_path, "llama", intermediate_size=100)
    with pytest.raises(ValueError, match="Hadamard matrix of intermediate_size 100"):
        LLM(str(odd), num_blocks=8, quantization="int8", quant_rotation="residual_and_down")
    LLM(str(odd), num_blocks=8, quantization="int8", quant_rotation="residual")  # folded: any size


def test_int8_engine_tracks_the_float_engine(tiny: Path) -> None:
    """Generation runs end to end on int8 (fused norm/SiLU quantization, int8 GEMMs) and its
    logits stay close to the float model's; SmoothQuant calibrates from the tokenizer's prompts."""
    ids = PROMPTS[2]
    plain = model_of(LLM(str(tiny), num_blocks=32))
    for kwargs in ({}, {"smoothquant_alpha": 0.5}, {"quant_rotation": "residual_and_down", "smoothquant_alpha": 0.5}):
        llm = LLM(str(tiny), num_blocks=32, quantization="int8", **kwargs)  # type: ignore[arg-type]
        assert all(len(t) == GREEDY.max_tokens for t in generate(llm))
        got = model_of(llm).compute_logits(prefill_hidden(model_of(llm), ids))
        want = plain.compute_logits(prefill_hidden(plain, ids))
        assert (got - want).abs().max() < 0.05 * want.abs().max()
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("arch", ["llama", "tied"])
def test_quantized_lm_head(tmp_path: Path, arch: str) -> None:
    """quantize_lm_head: the head's logits are the W8A8 product of its per-row int8 weight (an
    untied head's float weight freed, a tied one kept for the embedding) and stay close to the
    float head's; generation runs."""
    tied = arch == "tied"
    ckpt = write_tiny_checkpoint(tmp_path, "llama", tie_word_embeddings=tied)
    ids = PROMPTS[2]
    base = LLM(str(ckpt), num_blocks=32, quantization="int8")
    llm = LLM(str(ckpt), num_blocks=32, quantization="int8", quantize_lm_head=True)
    head, base_head = model_of(llm).head, model_of(base).head  # type: ignore[operator]
    assert head.head_quant is not None and head.head_quant.data.dtype == torch.int8
    want_q = quant_reference.quantize_rows(base_head.weight, torch.int8)
    assert torch.equal(head.head_quant.data, want_q.data)
    assert head.weight.numel() == (base_head.weight.numel() if tied else 0)
    hidden = prefill_hidden(model_of(llm), ids)
    got, want = model_of(llm).compute_logits(hidden), model_of(base).compute_logits(hidden)  # type: ignore[operator]
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    assert all(len(t) == GREEDY.max_tokens for t in generate(llm))
    with pytest.raises(ValueError, match="quantize_lm_head needs quantization set"):
        ModelConfig(quantize_lm_head=True)


def test_smoothquant_calibration_file(tiny: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "calib.txt"
    prompts.write_text("hello world\n\nThe quick brown fox jumps over the lazy dog.\n")
    llm = LLM(str(tiny), num_blocks=32, quantization="int8", smoothquant_alpha=0.5,
              smoothquant_calibration=str(prompts))
    assert all(len(t) == GREEDY.max_tokens for t in generate(llm))
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="has no prompts"):
        LLM(str(tiny), num_blocks=8, quantization="int8", smoothquant_alpha=0.5,
            smoothquant_calibration=str(tmp_path / "empty.txt"))


def test_quantization_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="need quantization set"):
        ModelConfig(smoothquant_alpha=0.5)
    with pytest.raises(ValueError, match="quantization"):
        ModelConfig(quantization="int4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="smoothquant_alpha"):
        ModelConfig(quantization="int8", smoothquant_alpha=1.5)
