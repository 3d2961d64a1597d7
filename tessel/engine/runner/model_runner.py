"""Owns the model, its paged KV cache and the sampler; runs steps through ``StepPipeline``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from tessel.config.model_arch import ModelArch
from tessel.engine.models.layers.parallel import SINGLE, ParallelRank
from tessel.engine.request import Logprob
from tessel.engine.runner.pipeline import InFlightStep, RunnerOutput, StepPipeline
from tessel.engine.sampler import Sampler
from tessel.engine.scheduler.output import SchedulerOutput
from tessel.kernels.attention.decode_plan import DecodeConfig

if TYPE_CHECKING:
    from tessel.engine.distributed.step_channel import StepChannel

__all__ = ["ModelRunner", "RunnerLimits", "RunnerOutput", "kv_bytes_per_block", "score_tokens"]


def kv_bytes_per_block(arch: ModelArch, block_size: int, dtype: torch.dtype, tp: ParallelRank = SINGLE) -> int:
    """Bytes of one block's K and V over all layers, on one rank (its KV heads only)."""
    elem = torch.empty((), dtype=dtype).element_size()
    kv_heads = tp.kv_heads(arch.num_key_value_heads)[0]
    return 2 * arch.num_hidden_layers * block_size * kv_heads * arch.head_dim * elem


@dataclass(frozen=True)
class RunnerLimits:
    """The largest step the scheduler can hand over, which sizes the pipeline's buffers."""

    max_tokens: int = 2048  # max_num_batched_tokens
    max_seqs: int = 256  # max_num_seqs
    max_model_len: int = 2048
    decode: DecodeConfig = DecodeConfig()
    graph_sizes: tuple[int, ...] = ()  # decode batch sizes to capture; empty: eager only


class ModelRunner:
    """``launch`` a step (stages 1-4, asynchronous on CUDA) and ``finish`` it; ``execute`` does both."""

    def __init__(
        self,
        model: nn.Module,
        arch: ModelArch,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
        limits: RunnerLimits = RunnerLimits(),
        tp: ParallelRank = SINGLE,
        channel: StepChannel | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """``kv_dtype``: the cache's (None: ``dtype``; E4M3 with ``kv_cache_dtype=fp8``)."""
        self.model = model
        self.arch = arch
        self.block_size = block_size
        self.device = device
        shape = (num_blocks, block_size, tp.kv_heads(arch.num_key_value_heads)[0], arch.head_dim)
        kv_dtype = kv_dtype or dtype
        self.kv_caches = [
            (torch.zeros(shape, dtype=kv_dtype, device=device), torch.zeros(shape, dtype=kv_dtype, device=device))
            for _ in range(arch.num_hidden_layers)
        ]
        self.sampler = Sampler(seed)
        self.pipeline = StepPipeline(
            model, arch, self.kv_caches, self.sampler, block_size,
            max_tokens=limits.max_tokens, max_seqs=limits.max_seqs, max_model_len=limits.max_model_len,
            decode_config=limits.decode, graph_sizes=list(limits.graph_sizes), tp=tp, channel=channel,
        )

    def launch(self, sched: SchedulerOutput, prev: InFlightStep | None = None) -> InFlightStep:
        return self.pipeline.launch(sched, prev)

    def finish(self, inflight: InFlightStep) -> RunnerOutput:
        return self.pipeline.finish(inflight)

    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        """One step, synchronously."""
        return self.finish(self.launch(sched))

    def forget(self, request_id: str) -> None:
        self.sampler.forget(request_id)


def score_tokens(logits: torch.Tensor, targets: list[int], num_top: int) -> list[Logprob]:
    """Logprob of each row's target token under that row's logits, with the top alternatives."""
    logprobs = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(targets, device=logprobs.device)
    chosen = logprobs.gather(1, target[:, None]).squeeze(1).tolist()
    top_v, top_i = logprobs.topk(num_top, dim=-1)
    return [
        Logprob(t, c, list(zip(ti, tv, strict=True)))
        for t, c, ti, tv in zip(targets, chosen, top_i.tolist(), top_v.tolist(), strict=True)
    ]
