"""Tensor parallel with W8A8 int8 on the CPU (gloo): each rank quantizes its own shard.

Weights: every rank's int8 weights and per-channel scales are exactly its slices of one rank's
int8 model. Column-parallel shards hold whole output rows; row-parallel shards hold part of
each row and agree on the whole row's scale (a MAX all-reduce at load time), as a quantized
checkpoint stores it. With SmoothQuant the replicated norm gains stay the same on every rank.

Outputs cannot be bit-identical to one rank: activations are quantized per token on the
tensor each rank holds, so o_proj's and down_proj's inputs get one scale per rank's slice of
the row instead of one per row. That changes int8 rounding, the size of int8's own error and
no larger (a slice's scale is never coarser than its row's), so the test bounds how far
TP=2 int8 is from TP=1 int8 by int8's own distance from float, and by a small absolute figure.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tessel.config.model_arch import ModelArch
from tessel.engine import LLM, SamplingParams
from tessel.engine.distributed.group import init_group
from tessel.engine.llm import engine_config_from_kwargs
from tessel.engine.loader import load_checkpoint
from tessel.engine.models.layers.linear import ColumnParallelLinear, RowParallelLinear
from tessel.engine.shard_setup import build_shard
from tests.checkpoints import write_tiny_checkpoint
from tests.engine.test_tensor_parallel import ENGINE, PROMPTS, run

SIZE = 2
SCORED = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2)
LONG_PROMPT = [5, 17, 33, 90, 41, 7, *range(3, 60)]


def _int8_params(directory: str, alpha: float | None, rank: int = 0, store_path: str | None = None) -> dict:
    """One rank's parameters after ``build_shard`` (quantized, CPU-packed), by module name."""
    config = engine_config_from_kwargs(
        directory, quantization="int8", smoothquant_alpha=alpha, tensor_parallel_size=SIZE if store_path else 1,
        **ENGINE,
    )
    group = None
    if store_path is not None:
        torch.set_num_threads(1)
        group = init_group(rank, SIZE, "cpu", 60.0, store=dist.FileStore(store_path, SIZE))
    checkpoint = load_checkpoint(config.model)
    shard = build_shard(config, checkpoint, ModelArch.from_hf(checkpoint.hf_config), group)
    params = {n: p.detach().clone() for n, p in shard.model.named_parameters()}
    if group is not None:
        group.destroy()
    return {"params": params, "modules": dict(shard.model.named_modules())}


def _rank_main(rank: int, directory: str, alpha: float | None, store_path: str, out: str) -> None:
    params = _int8_params(directory, alpha, rank, store_path)["params"]
    torch.save(params, f"{out}/rank{rank}.pt")


def _ranks(tmp_path: Path, directory: str, alpha: float | None) -> list[dict[str, torch.Tensor]]:
    mp.spawn(_rank_main, args=(directory, alpha, str(tmp_path / "store"), str(tmp_path)), nprocs=SIZE)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(SIZE)]


def _slice(layer: torch.nn.Module, param: str, full: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank ``rank``'s part of one rank's (TP=1) parameter ``param`` of ``layer`` (also TP=1)."""
    if isinstance(layer, ColumnParallelLinear):  # output rows, per fused part (q/k/v, gate/up)
        parts = full.split(layer.local_sizes)
        return torch.cat([p.narrow(0, rank * (p.shape[0] // SIZE), p.shape[0] // SIZE) for p in parts])
    assert isinstance(layer, RowParallelLinear)
    if param == "weight_scale":  # one scale per output row: the whole row's, on every rank
        return full
    n = full.shape[1] // SIZE
    return full.narrow(1, rank * n, n)


def test_int8_shards_are_exactly_slices_of_one_rank_int8(tmp_path: Path) -> None:
    directory = str(write_tiny_checkpoint(tmp_path, "llama", num_key_value_heads=2))  # KV heads split
    one = _int8_params(directory, None)
    ranks = _ranks(tmp_path, directory, None)
    checked = 0
    for name, full in one["params"].items():
        module, _, param = name.rpartition(".")
        layer = one["modules"][module]
        if not isinstance(layer, ColumnParallelLinear | RowParallelLinear):
            continue
        assert full.dtype == (torch.int8 if param == "weight" else torch.float32), name
        for rank, shard in enumerate(ranks):
            torch.testing.assert_close(
                shard[name], _slice(layer, param, full, rank), rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}"
            )
        checked += 1
    assert checked == 2 * 4 * 2  # 2 layers x (qkv, o, gate_up, down) x (weight, weight_scale)


def test_smoothquant_under_tp_keeps_replicated_gains_identical(tmp_path: Path) -> None:
    """The scales folded into the norm gains come from the whole qkv / gate_up weight (a MAX over
    the ranks' rows), so every rank holds the same gain, and it is one rank's up to the float
    rounding of the calibration prefill (a sum over ranks in another order)."""
    directory = str(write_tiny_checkpoint(tmp_path, "llama", num_key_value_heads=2))
    one = _int8_params(directory, 0.5)["params"]
    ranks = _ranks(tmp_path, directory, 0.5)
    gains = [n for n in one if n.endswith("layernorm.weight")]
    assert len(gains) == 4
    for name in gains:
        torch.testing.assert_close(ranks[0][name], ranks[1][name], rtol=0, atol=0)
        torch.testing.assert_close(ranks[0][name], one[name], rtol=1e-4, atol=1e-6)
        assert not torch.equal(one[name], torch.ones_like(one[name]))  # smoothing did change them


def test_tp2_int8_runs_and_stays_within_int8_noise_of_tp1(tmp_path: Path) -> None:
    directory = str(write_tiny_checkpoint(tmp_path, "llama", num_key_value_heads=2))
    float_lp = LLM(directory, **ENGINE).generate([LONG_PROMPT], SCORED)[0].prompt_logprobs
    single = LLM(directory, quantization="int8", **ENGINE)
    expected_lp = single.generate([LONG_PROMPT], SCORED)[0].prompt_logprobs
    single_tokens = run(single, PROMPTS)
    with LLM(directory, tensor_parallel_size=2, quantization="int8", **ENGINE) as llm:
        got_lp = llm.generate([LONG_PROMPT], SCORED)[0].prompt_logprobs
        tokens = run(llm, PROMPTS)  # staggered batch, chunked prefill, overlap; frees every block
    assert float_lp and expected_lp and got_lp
    pairs = [(g, e, f) for g, e, f in zip(got_lp, expected_lp, float_lp, strict=True) if e is not None]
    assert all(g.token_id == e.token_id for g, e, _ in pairs)  # teacher-forced: the same tokens scored
    tp_drift = max(abs(g.logprob - e.logprob) for g, e, _ in pairs)
    int8_error = max(abs(e.logprob - f.logprob) for _, e, f in pairs)
    assert 0 < tp_drift <= min(2 * int8_error, 0.05), (tp_drift, int8_error)
    # where one rank's top choice leads by more than the noise, TP=2 int8 makes the same choice
    for g, e, _ in pairs:
        (top1, lp1), (_, lp2) = e.top[0], e.top[1]
        if lp1 - lp2 > 4 * tp_drift:
            assert g.top[0][0] == top1
    assert len(tokens) == len(single_tokens) == len(PROMPTS)


def test_tp2_quantized_lm_head_matches_tp1(tmp_path: Path) -> None:
    """quantize_lm_head under TP: each rank quantizes its vocabulary rows (whole rows, so the same
    codes and scales as one rank), and the gathered logits stay within TP's summation noise."""
    directory = str(write_tiny_checkpoint(tmp_path, "llama", num_key_value_heads=2))
    kw = {"quantization": "int8", "quantize_lm_head": True, **ENGINE}
    expected = LLM(directory, **kw).generate([LONG_PROMPT], SCORED)[0].prompt_logprobs  # type: ignore[arg-type]
    with LLM(directory, tensor_parallel_size=2, **kw) as llm:  # type: ignore[arg-type]
        got = llm.generate([LONG_PROMPT], SCORED)[0].prompt_logprobs
    pairs = [(g, e) for g, e in zip(got or [], expected or [], strict=True) if e is not None]
    assert pairs and max(abs(g.logprob - e.logprob) for g, e in pairs) <= 0.05
