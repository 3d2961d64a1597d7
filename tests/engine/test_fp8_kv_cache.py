"""``kv_cache_dtype=fp8`` on the CPU engine: the cache is E4M3, holds 4x the blocks of an fp32
cache in the same memory, and the engine's logprobs are transformers' with every key (after
RoPE) and value rounded to E4M3, which is what the cache stores."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers

from tessel.engine import LLM, SamplingParams
from tests.checkpoints import write_tiny_checkpoint

PROMPT = [5, 17, 33, 42, 8, 99, 120, 7, 64, 3, 11, 12, 13, 14, 15, 16, 17, 18]
FP8 = torch.float8_e4m3fn


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(FP8).to(x.dtype)


def _reference_logprobs(directory: Path, monkeypatch: pytest.MonkeyPatch, round_kv: bool) -> torch.Tensor:
    # imported here: it loads Triton, which must not be imported before tests/kernels/conftest.py
    # sets TRITON_INTERPRET (pytest collects this module first)
    from transformers.models.llama import modeling_llama

    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    if round_kv:
        rope = modeling_llama.apply_rotary_pos_emb

        def rope_then_round(q, k, cos, sin, *args, **kwargs):  # type: ignore[no-untyped-def]
            q, k = rope(q, k, cos, sin, *args, **kwargs)
            return q, _e4m3(k)

        monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", rope_then_round)
        for layer in model.model.layers:
            layer.self_attn.v_proj.register_forward_hook(lambda _m, _i, out: _e4m3(out))
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    monkeypatch.undo()
    return logprobs


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), "llama")


def _prompt_logprobs(llm: LLM) -> list[float]:
    """Each prompt token's logprob (prefill), then the greedy continuation's (decode)."""
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, prompt_logprobs=0, logprobs=0,
                                                ignore_eos=True))[0]
    assert out.prompt_logprobs is not None and out.outputs[0].logprobs is not None
    prompt = [lp.logprob for lp in out.prompt_logprobs[1:] if lp is not None]
    return prompt + [lp.logprob for lp in out.outputs[0].logprobs]


def test_fp8_cache_holds_4x_the_blocks_of_fp32(directory: Path) -> None:
    sizes = {}
    for kv in ("auto", "fp8"):
        llm = LLM(str(directory), block_size=4, kv_cache_memory_gb=0.01, kv_cache_dtype=kv)
        caches = llm.core.runner.kv_caches  # type: ignore[attr-defined]
        assert caches[0][0].dtype == (FP8 if kv == "fp8" else torch.float32)
        sizes[kv] = caches[0][0].shape[0]
        llm.shutdown()
    assert sizes["fp8"] // 4 == sizes["auto"]  # the same bytes, a quarter each


def test_fp8_cache_logprobs_are_transformers_with_kv_rounded(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exact = _reference_logprobs(directory, monkeypatch, round_kv=False)
    rounded = _reference_logprobs(directory, monkeypatch, round_kv=True)
    with LLM(str(directory), block_size=4, kv_cache_dtype="fp8") as llm:
        out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=0))[0]
    assert out.prompt_logprobs is not None
    got = [lp.logprob for lp in out.prompt_logprobs[1:] if lp is not None]
    want = [rounded[i - 1, PROMPT[i]].item() for i in range(1, len(PROMPT))]
    plain = [exact[i - 1, PROMPT[i]].item() for i in range(1, len(PROMPT))]
    assert all(math.isclose(g, w, abs_tol=1e-4) for g, w in zip(got, want, strict=True))
    # the rounding is visible: the same prompt through an exact cache scores differently
    assert max(abs(g - p) for g, p in zip(got, plain, strict=True)) > 1e-3


def test_fp8_cache_decodes_close_to_an_exact_cache(directory: Path) -> None:
    """Prefill and decode steps through the fp8 cache stay within a small distance of the fp32
    cache's logprobs (decode reads only the cache, chunked prefill reads its prefix there)."""
    with LLM(str(directory), block_size=4, max_num_batched_tokens=8) as exact_llm:
        exact = _prompt_logprobs(exact_llm)
    with LLM(str(directory), block_size=4, max_num_batched_tokens=8, kv_cache_dtype="fp8") as fp8_llm:
        fp8 = _prompt_logprobs(fp8_llm)
    assert len(fp8) == len(exact)
    assert max(abs(a - b) for a, b in zip(fp8, exact, strict=True)) < 0.05
