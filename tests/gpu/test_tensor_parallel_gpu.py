"""Tensor parallel on CUDA (NCCL, one worker process per GPU): greedy tokens equal one GPU's with
the Triton kernels, decode CUDA graphs (NCCL all-reduces captured inside them) and overlap
scheduling on, and with graphs off. Needs 2 GPUs (3 for the SmolLM2 shapes):
``pytest -m gpu tests/gpu/test_tensor_parallel_gpu.py``.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

from tessel.engine import LLM, SamplingParams  # noqa: E402
from tests.checkpoints import write_tiny_checkpoint  # noqa: E402

PROMPTS = [[5, 17, 33, 90, 41, 7], [100, 3], list(range(3, 120)), [250, 251, 252, 9, 9, 9, 9], [42], list(range(7, 40))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
GRAPH_SIZES = [1, 2, 4, 8]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tp-gpu"), "llama", max_position_embeddings=512)


def generate(model: str, tp: int, **kw: object) -> list[list[int]]:
    llm = LLM(model, device="cuda", cuda_graph_batch_sizes=GRAPH_SIZES, gpu_memory_utilization=0.3,
              tensor_parallel_size=tp, **kw)
    try:
        outs = llm.generate(PROMPTS, GREEDY)
        stats = llm.core.stats()
        assert stats.kv_blocks_used == 0 and stats.tensor_parallel_size == tp
        if not kw.get("enforce_eager"):
            assert stats.cuda_graph_steps_total > 0
    finally:
        llm.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv-split", "kv-replicated"])
def test_tp2_equals_tp1_fp32(tiny_dir: Path, tmp_path: Path, kv_heads: int, eager: bool) -> None:
    directory = tiny_dir if kv_heads == 2 else write_tiny_checkpoint(
        tmp_path, "llama", max_position_embeddings=512, num_key_value_heads=1
    )
    kw = {"dtype": "float32", "enforce_eager": eager}
    assert generate(str(directory), 2, **kw) == generate(str(directory), 1, **kw)


@pytest.mark.skipif(torch.cuda.device_count() < 3, reason="needs 3 CUDA GPUs")
def test_smollm2_shapes_tp3_equals_tp1_fp32() -> None:
    kw = {"dtype": "float32", "load_format": "dummy"}
    assert generate("SmolLM2-135M", 3, **kw) == generate("SmolLM2-135M", 1, **kw)
