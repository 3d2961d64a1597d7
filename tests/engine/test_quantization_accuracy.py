"""W8A8 against the unquantized default model, through the CPU reference path of the real engine.

Every variant scores the same public-domain text (tests/data/, 475 tokens) with prompt logprobs
and is compared with the float32 model: perplexity ratio, and how often its top-1 next token is
the float32 model's.

Issue 7 asks for perplexity within 2% and top-1 agreement >= 97%. Measured here (SmolLM2-135M):
int8 with SmoothQuant (alpha 0.5) and int8 with rotation (residual stream and down_proj's input)
meet the perplexity target; none meets 97% agreement (rotated int8 comes nearest, ~95%), and
the ``bf16`` row shows why: the unquantized model merely run in bfloat16 agrees at ~97.3%, and
quantizing any single one of the 30 layers already costs 1-3 points (the text has many near-tied
next tokens). So the bounds below are the issue's where they hold and, elsewhere, the measured
figure less a small margin, to catch regressions; the report states the misses. Over 474
positions an agreement near 96% carries about +-1.8 points, so the figures and seed spreads below
are mostly noise at the point's scale: ``benchmarks/quant_accuracy.py`` scores the same variants
over a 4,952-token text too (+-0.5 points; benchmarks/results/quant_accuracy_cpu.md).

fp8 cannot run on the CPU engine (it refuses without E4M3 tensor cores); that case lifts the check
to run the reference ops, which round to E4M3 exactly as the kernels do and accumulate in fp32,
so it measures fp8's numerics, not its speed.
"""

from __future__ import annotations

import pytest

from benchmarks.quant_accuracy import TEXTS, perplexity, score
from benchmarks.quant_accuracy import agreement as top1_agreement
from tessel.engine.models.layers.quantization import config as quant_config

TEXT = TEXTS["test text"].read_text()

# (engine kwargs, max perplexity ratio, min top-1 agreement); measured figures in the comments,
# on an AVX2 CPU / an AVX-512 one. The fp32 ops round differently with the vector width (oneDNN's
# GEMMs, our C kernels), that flips some int8/E4M3 roundings, and near-tied next tokens amplify it:
# the bounds leave room for both machines.
VARIANTS = {
    "bf16": ({"dtype": "bfloat16"}, 1.01, 0.955),  # 1.0046, 0.9726 / 1.0019, 0.9662: the metric's floor
    "int8-smoothquant0.5": ({"quantization": "int8", "smoothquant_alpha": 0.5}, 1.02, 0.90),  # 0.9961, 0.9198 / 0.9955, 0.9262
    "int8": ({"quantization": "int8"}, 1.08, 0.85),  # 1.0476, 0.8861 / 1.0651, 0.8776
    # Rotation's figures move by about a point with its seed (seeds 0-3, AVX-512: 0.9515, 0.9662,
    # 0.9451, 0.9557); SmoothQuant on top of it adds nothing measurable (alpha 0.3: 0.9641, 0.9494, 0.9473).
    "int8-rotation": ({"quantization": "int8", "quant_rotation": "residual_and_down"}, 1.02, 0.93),  # - / 1.0008, 0.9515
    # GPTQ-rounded weights (quant_gptq). Over rotation seeds 0-7: top-1 95.2-97.3% (mean 96.1%),
    # against round-to-nearest's 94.3-96.6% (mean 95.4%), not worse in 7 of 8; perplexity x1.000-x1.014.
    # A one-off with float weights and int8 activations reached 97.5%: weights are most of the loss.
    # Keeping any one of the four linear kinds in float (seeds 0 and 1) gains 0.2-1.7 points, none
    # reaching 97% on both; the calibration prompts' KL to float32 ranks the seeds unlike this text
    # does (seed 2: worst KL, 96.6%), so choosing a seed by calibration would not help either.
    # More calibration tokens do not help consistently either (AVX2, seeds 0-3, built-in prompts:
    # 95.8/96.4/96.4/95.8%): adding 32 x 128 tokens sampled from the float model itself gave
    # 96.0/96.4/97.5/96.8%, but 64 x 256 gave 94.7/96.4/96.2% (seeds 0-2).
    "int8-rotation-gptq": (  # - / 1.0104, 0.9620
        {"quantization": "int8", "quant_rotation": "residual_and_down", "quant_gptq": True}, 1.03, 0.94),
    "int8-rotation-residual": ({"quantization": "int8", "quant_rotation": "residual"}, 1.04, 0.90),  # - / 1.0230, 0.9283
    "int8-rotation-lm_head": (  # the LM head W8A8 too: - / 1.0015, 0.9473
        {"quantization": "int8", "quant_rotation": "residual_and_down", "quantize_lm_head": True}, 1.02, 0.92),
    # An E4M3 KV cache (kv_cache_dtype=fp8, scale 1.0) on the float32 model, then under int8
    "fp8-kv-cache": ({"kv_cache_dtype": "fp8"}, 1.03, 0.91),  # 1.0123, 0.9346 / -
    "int8-smoothquant0.5-fp8-kv-cache": (  # 1.0054, 0.9093 / -
        {"quantization": "int8", "smoothquant_alpha": 0.5, "kv_cache_dtype": "fp8"}, 1.03, 0.88),
    "fp8-numerics-on-cpu": ({"quantization": "fp8"}, 1.05, 0.90),  # 1.0353, 0.9241 / 1.0231, 0.9241
    # Rotation hurts E4M3, whose error is relative: it spreads the error of the few huge channels
    # over all of them. Kept as a measured regression bound, not a recommendation.
    "fp8-rotation": ({"quantization": "fp8", "quant_rotation": "residual_and_down"}, 1.12, 0.83),  # - / 1.0864, 0.8629
}


@pytest.fixture(scope="module")
def float32() -> tuple[list[float], list[int]]:
    return score(TEXT)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_quantized_perplexity_and_top1_against_float32(
    float32: tuple[list[float], list[int]], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs, max_ratio, min_agreement = VARIANTS[name]
    if kwargs.get("quantization") == "fp8":
        monkeypatch.setattr(quant_config, "check_fp8_device", lambda device: None)
    base_lp, base_top = float32
    lp, top = score(TEXT, **kwargs)
    ratio = perplexity(lp) / perplexity(base_lp)
    agreement = top1_agreement(top, base_top)
    print(f"\n{name}: perplexity {perplexity(lp):.4f} vs float32 {perplexity(base_lp):.4f} "
          f"(ratio {ratio:.4f}); top-1 agreement {agreement:.4f} over {len(top)} positions")
    assert 1 / max_ratio <= ratio <= max_ratio
    assert agreement >= min_agreement
