"""Runs one scheduled step on the model: inputs -> forward -> logits -> sampled tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from config.model_arch import ModelArch
from engine.request import Logprob
from engine.runner.input_batch import ModelInputs, build_model_inputs
from engine.sampler import Sampler
from engine.sampling_metadata import SamplingMetadata
from engine.scheduler.output import SchedulerOutput


@dataclass
class RunnerOutput:
    """What a step produced, on the host, keyed by request id."""

    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, Logprob] = field(default_factory=dict)
    # request id -> (prompt index of the first scored token, logprobs from there on)
    prompt_logprobs: dict[str, tuple[int, list[Logprob]]] = field(default_factory=dict)


def kv_bytes_per_block(arch: ModelArch, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * arch.num_hidden_layers * block_size * arch.num_key_value_heads * arch.head_dim * elem


class ModelRunner:
    """Owns the model, its paged KV cache and the sampler."""

    def __init__(
        self,
        model: nn.Module,
        arch: ModelArch,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.arch = arch
        self.block_size = block_size
        self.device = device
        shape = (num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(arch.num_hidden_layers)
        ]
        self.sampler = Sampler(seed)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        inputs = build_model_inputs(sched.scheduled, self.block_size, self.device)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn)
        out = RunnerOutput()
        if inputs.prompt_logprobs:
            out.prompt_logprobs = self._prompt_logprobs(hidden, inputs)
        if not inputs.sampling:
            return out
        logits = self.model.compute_logits(hidden.index_select(0, inputs.logits_indices)).float()
        requests = [s.request for s in inputs.sampling]
        meta = SamplingMetadata.build(requests, self.arch.vocab_size, self.device)
        result = self.sampler.sample(logits, meta)
        for i, request in enumerate(requests):
            out.sampled[request.request_id] = result.token_ids[i]
            if result.logprobs is not None and (lp := result.logprobs[i]) is not None:
                out.logprobs[request.request_id] = lp
        return out

    def forget(self, request_id: str) -> None:
        self.sampler.forget(request_id)

    def _prompt_logprobs(
        self, hidden: torch.Tensor, inputs: ModelInputs
    ) -> dict[str, tuple[int, list[Logprob]]]:
        """Score each prompt token under the logits of the position before it (for echo)."""
        result: dict[str, tuple[int, list[Logprob]]] = {}
        for chunk in inputs.prompt_logprobs:
            logits = self.model.compute_logits(hidden[chunk.rows]).float()
            result[chunk.request_id] = (chunk.first_target, score_tokens(logits, chunk.targets, chunk.num_top))
        return result


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
