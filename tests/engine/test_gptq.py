"""GPTQ rounding of W8A8 weights (quant_gptq): on round-to-nearest's grid and scales, exactly
round-to-nearest where the inputs are uncorrelated, closer outputs where they are not, and the
engine option end to end. Tiny random checkpoints, CPU reference path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tessel.config import ModelConfig
from tessel.engine import LLM, SamplingParams
from tessel.engine.llm import engine_config_from_kwargs
from tessel.engine.models.layers.quantization.calibration import prefill_hidden
from tessel.engine.models.layers.quantization.gptq import gptq_quantize
from tessel.kernels.quant import reference as quant_reference
from tessel.kernels.quant.types import FP8_DTYPE
from tests.checkpoints import write_tiny_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def correlated_inputs(tokens: int, k: int, seed: int) -> torch.Tensor:
    """Activations along a few strong directions (the same for every seed), as a model's are."""
    basis = torch.randn(8, k, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, 8, generator=g, dtype=torch.float64) @ basis * 3
            + torch.randn(tokens, k, generator=g, dtype=torch.float64) * 0.3)


def dequant(q: object) -> torch.Tensor:
    return q.data.double() * q.scale.double()  # type: ignore[attr-defined]


@pytest.mark.parametrize("qdtype", [torch.int8, FP8_DTYPE])
def test_uncorrelated_inputs_give_round_to_nearest(qdtype: torch.dtype) -> None:
    """With a diagonal H no column's error has anywhere to go: GPTQ is round-to-nearest."""
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(1))
    h = torch.diag(torch.rand(64, generator=torch.Generator().manual_seed(2)) + 0.5)
    got, want = gptq_quantize(w, h, qdtype), quant_reference.quantize_rows(w, qdtype)
    assert torch.equal(got.scale, want.scale)
    assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))


@pytest.mark.parametrize("qdtype", [torch.int8, FP8_DTYPE])
def test_correlated_inputs_get_closer_outputs_on_the_same_grid(qdtype: torch.dtype) -> None:
    k = 96
    w = torch.randn(64, k, generator=torch.Generator().manual_seed(3)) * 0.05
    x_cal, x_test = correlated_inputs(256, k, seed=4), correlated_inputs(256, k, seed=5)
    got, rtn = gptq_quantize(w, (x_cal.T @ x_cal).float(), qdtype), quant_reference.quantize_rows(w, qdtype)
    assert torch.equal(got.scale, rtn.scale) and got.data.dtype == qdtype  # same format for the kernels
    want = x_test @ w.double().T

    def err(q: object) -> float:
        return float((x_test @ dequant(q).T - want).norm())

    assert err(got) < 0.7 * err(rtn)  # on inputs it was not calibrated on


def test_engine_option_end_to_end(tmp_path: Path) -> None:
    """quant_gptq: int8 weights on round-to-nearest's scales but partly other grid points, logits
    close to the float model's, generation runs. (Whether it beats round-to-nearest is a question
    for a trained model, tests/engine/test_quantization_accuracy.py: random weights' inputs have
    little of the correlation GPTQ feeds on.)"""
    ckpt = write_tiny_checkpoint(tmp_path, "llama")
    ids = list(range(3, 60))
    plain = LLM(str(ckpt), num_blocks=32).core.runner.model
    rtn = LLM(str(ckpt), num_blocks=32, quantization="int8", quant_rotation="residual").core.runner.model
    llm = LLM(str(ckpt), num_blocks=32, quantization="int8", quant_rotation="residual", quant_gptq=True)
    model = llm.core.runner.model
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        got, base = model.model.layers[0].get_submodule(name), rtn.model.layers[0].get_submodule(name)
        assert got.weight.dtype == torch.int8 and torch.equal(got.weight_scale, base.weight_scale)
        changed = (got.weight != base.weight).float().mean()
        assert 0 < changed < 0.5, name  # most weights keep their nearest grid point
    got, want = model.compute_logits(prefill_hidden(model, ids)), plain.compute_logits(prefill_hidden(plain, ids))
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in llm.generate([ids, [5, 6]], GREEDY))


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="quant_gptq needs quantization set"):
        ModelConfig(quant_gptq=True)
    with pytest.raises(ValueError, match="quant_gptq needs tensor_parallel_size=1"):
        engine_config_from_kwargs(None, quantization="int8", quant_gptq=True, tensor_parallel_size=2)
    ModelConfig(quantization="int8", quant_gptq=True, smoothquant_calibration="prompts.txt")  # its calibration
