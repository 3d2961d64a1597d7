"""Batched sampling: logits processors, greedy/random choice with per-request seeds, logprobs."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch

from tessel.engine.request import Logprob
from tessel.engine.sampling_metadata import (
    PenaltyTensors,
    SamplingMetadata,
    TokenEdits,
    TruncationTensors,
)
from tessel.kernels import dispatch
from tessel.kernels.sampling_types import TemperatureDraws

# Smallest exponential draw we divide by; a draw of exactly 0 would turn a zero-probability
# token's 0/0 into NaN, which argmax would pick.
_MIN_EXPONENTIAL = 1e-20
# Up to this k, top-k by torch.topk beats a full sort of the vocabulary.
_TOPK_FAST_MAX = 1024


@dataclass
class SamplerOutput:
    """What one step sampled, already on the host."""

    token_ids: list[int]  # one per row
    logprobs: list[Logprob | None] | None  # per row; None for rows that did not ask, or all


class Sampler:
    """Turns a step's logits into token ids; keeps one torch.Generator per seeded request."""

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._shared: dict[torch.device, torch.Generator] = {}
        self._seeded: dict[str, torch.Generator] = {}
        self._bases = random.Random(seed)  # fused path: a seed for each request that set none
        self._base_seed: dict[str, int] = {}

    def forget(self, request_id: str) -> None:
        """Drop a finished request's generator."""
        self._seeded.pop(request_id, None)
        self._base_seed.pop(request_id, None)

    def sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """Choose one token per row of ``logits`` [B, V] float32 (modified in place); one host sync."""
        tokens, raw_logprobs = self.sample_on_device(logits, meta)
        return self.to_host(tokens, raw_logprobs, meta)

    def sample_on_device(
        self, logits: torch.Tensor, meta: SamplingMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``sample`` without the host sync: token ids [B] and raw logprobs stay on the device.
        ``logits`` may be half precision; they are read in place on the fused path, else copied to float32."""
        if logits.is_cuda and fusable(meta):
            return self._sample_fused(logits, meta), None
        logits = logits.float()
        raw_logprobs = None
        if meta.max_num_logprobs is not None:
            raw_logprobs = torch.log_softmax(logits, dim=-1)  # vLLM v1 default: before processing
        logits = process_logits(logits, meta)
        tokens = dispatch.argmax_rows(logits)  # greedy rows: argmax of the processed logits
        if not meta.all_greedy:
            sampled = self._draw(random_logits(logits, meta), meta)
            tokens = torch.where(meta.greedy, tokens, sampled)
        return tokens, raw_logprobs

    def warm_up(self, logits: torch.Tensor) -> None:
        """Compile the fused path's greedy and temperature variants for these logits (shape
        and dtype as a step makes them) at startup: else the first request of each kind pays
        Triton's compile, about a second, inside a step of the running batch."""
        if not logits.is_cuda or os.environ.get("TESSEL_FUSED_SAMPLING", "1") == "0":
            return
        dispatch.sample_tokens(logits)
        ones = torch.ones(logits.shape[0], dtype=torch.int64, device=logits.device)
        inv_temperature = torch.ones(logits.shape[0], dtype=torch.float32, device=logits.device)
        dispatch.sample_tokens(logits, TemperatureDraws(inv_temperature, ones, ones))

    def _sample_fused(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """One read of the logits on CUDA: a request's draw is keyed by its seed (its own, or one
        drawn for it once) and its output length, so batch neighbours never change it."""
        if meta.all_greedy:
            return dispatch.sample_tokens(logits)
        seeds = [self._request_seed(rid, seed) for rid, seed in zip(meta.request_ids, meta.seeds, strict=True)]
        assert meta.inv_temperature is not None  # built whenever a row is not greedy
        seeds_dev, steps_dev = draw_keys(seeds, meta.output_lengths, logits.device)
        return dispatch.sample_tokens(logits, TemperatureDraws(meta.inv_temperature, seeds_dev, steps_dev))

    def _request_seed(self, request_id: str, seed: int | None) -> int:
        if seed is not None:
            return seed
        if request_id not in self._base_seed:
            self._base_seed[request_id] = self._bases.getrandbits(62)
        return self._base_seed[request_id]

    def _draw(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """One token per row from softmax(``logits``); a seeded row reads only its own stream."""
        probs = torch.softmax(logits, dim=-1)
        if probs.is_cuda:
            return self._exponential_race(probs, meta)
        return self._inverse_cdf(probs, meta)

    def _exponential_race(self, probs: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """argmax(p / E) with E ~ Exp(1): elementwise passes, no per-row work on the host."""
        noise = torch.empty_like(probs).exponential_(generator=self._shared_generator(probs.device))
        for row, seed in enumerate(meta.seeds):
            if seed is not None:
                noise[row].exponential_(
                    generator=self._row_generator(meta.request_ids[row], seed, probs.device)
                )
        return (probs / noise.clamp_min_(_MIN_EXPONENTIAL)).argmax(dim=-1)

    def _inverse_cdf(self, probs: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """The first token whose cumulative mass passes a uniform draw, one draw a row: on the
        CPU, torch's exponential_ costs ~19 ns an element, so the race above took 59 ms of a
        232 ms step for 64 rows of a 49K vocabulary; this takes ~6 ms. A zero-mass token never
        wins: its cumulative mass equals the one before it, which the search reaches first."""
        uniforms = torch.rand(len(meta.seeds), dtype=torch.float64, generator=self._shared_generator(probs.device))
        for row, seed in enumerate(meta.seeds):
            if seed is not None:
                generator = self._row_generator(meta.request_ids[row], seed, probs.device)
                uniforms[row] = torch.rand(1, dtype=torch.float64, generator=generator)[0]
        cdf = probs.cumsum(dim=-1, dtype=torch.float64)  # float64: no drift over 100K+ terms
        targets = (uniforms * cdf[:, -1]).unsqueeze(1)
        return torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp_max_(probs.shape[1] - 1)

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        if device not in self._shared:
            self._shared[device] = torch.Generator(device=device).manual_seed(self._seed)
        return self._shared[device]

    def _row_generator(self, request_id: str, seed: int, device: torch.device) -> torch.Generator:
        if request_id not in self._seeded:
            self._seeded[request_id] = torch.Generator(device=device).manual_seed(seed)
        return self._seeded[request_id]

    @staticmethod
    def to_host(
        tokens: torch.Tensor, raw_logprobs: torch.Tensor | None, meta: SamplingMetadata
    ) -> SamplerOutput:
        if raw_logprobs is None or meta.max_num_logprobs is None:
            return SamplerOutput(token_ids=tokens.tolist(), logprobs=None)
        chosen = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        top_values, top_ids = raw_logprobs.topk(meta.max_num_logprobs, dim=-1)  # sorted, best first
        # One transfer: ids are exact in float64 (vocabularies are far below 2**53).
        packed = torch.cat(
            [
                tokens.unsqueeze(1).double(),
                chosen.unsqueeze(1).double(),
                top_ids.double(),
                top_values.double(),
            ],
            dim=1,
        ).tolist()
        k = meta.max_num_logprobs
        token_ids: list[int] = []
        logprobs: list[Logprob | None] = []
        for row, n in zip(packed, meta.num_logprobs, strict=True):
            token_ids.append(int(row[0]))
            if n is None:
                logprobs.append(None)
                continue
            top = [(int(t), v) for t, v in zip(row[2 : 2 + n], row[2 + k : 2 + k + n], strict=True)]
            logprobs.append(Logprob(token_id=int(row[0]), logprob=row[1], top=top))
        return SamplerOutput(token_ids=token_ids, logprobs=logprobs)


def fusable(meta: SamplingMetadata) -> bool:
    """Greedy / temperature only: no logprobs, logit edits, penalties, top-k/top-p or min-p."""
    return (
        meta.max_num_logprobs is None
        and meta.logit_bias is None
        and meta.banned is None
        and meta.penalties is None
        and meta.truncation is None
        and meta.min_p is None
        and os.environ.get("TESSEL_FUSED_SAMPLING", "1") != "0"
    )


def process_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Apply, in place and in this order: logit_bias, min_tokens bans, penalties."""
    if meta.logit_bias is not None:
        bias: TokenEdits = meta.logit_bias
        logits.index_put_((bias.rows, bias.token_ids), bias.values, accumulate=True)
    if meta.banned is not None:
        logits[meta.banned.rows, meta.banned.token_ids] = float("-inf")
    if meta.penalties is not None:
        logits[meta.penalties.rows] = apply_penalties(logits[meta.penalties.rows], meta.penalties)
    return logits


def apply_penalties(logits: torch.Tensor, pen: PenaltyTensors) -> torch.Tensor:
    """Repetition (HF: divide positive, multiply negative logits of seen tokens), then
    OpenAI presence and frequency penalties over output tokens. ``logits`` holds pen.rows only."""
    if pen.repetition is not None and pen.prompt_mask is not None:
        seen = pen.prompt_mask | (pen.output_counts > 0)
        factor = pen.repetition.unsqueeze(1)
        penalized = torch.where(logits > 0, logits / factor, logits * factor)
        logits = torch.where(seen, penalized, logits)
    counts = pen.output_counts
    return (
        logits
        - pen.frequency.unsqueeze(1) * counts
        - pen.presence.unsqueeze(1) * (counts > 0).to(logits.dtype)
    )


def random_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p as -inf masks; rows are independent."""
    if meta.temperature is not None:
        logits = logits / meta.temperature.unsqueeze(1)
    if meta.truncation is not None:
        rows = meta.truncation.rows
        logits[rows] = truncate(logits[rows], meta.truncation)
    if meta.min_p is not None:
        probs = torch.softmax(logits, dim=-1)
        threshold = meta.min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def truncate(logits: torch.Tensor, trunc: TruncationTensors) -> torch.Tensor:
    """top-k / top-p for ``trunc.rows``: a small top-k alone needs no full sort."""
    if trunc.top_p is None and trunc.top_k is not None and trunc.max_top_k <= _TOPK_FAST_MAX:
        best = logits.topk(trunc.max_top_k, dim=-1).values  # sorted, largest first
        kth = best.gather(1, (trunc.top_k - 1).unsqueeze(1))
        return logits.masked_fill(logits < kth, float("-inf"))
    return apply_top_k_top_p(logits, trunc.top_k, trunc.top_p)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Keep the k largest logits (ties at the k-th kept) and the minimal nucleus of mass >= p."""
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        kth = sorted_logits.gather(1, (logits.shape[1] - top_k).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        # Ascending cumulative mass: drop a token while the mass up to it is <= 1 - p,
        # which leaves the smallest set of largest tokens whose mass reaches p.
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p).unsqueeze(1)
        drop[:, -1] = False  # always keep the best token
        sorted_logits.masked_fill_(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def draw_keys(seeds: list[int], steps: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's seed and step on ``device``, in one copy. The two rows are padded to an even
    width so the second starts 16-byte aligned like the first: Triton compiles a kernel apart
    for a pointer that is not, which an odd batch would otherwise pay inside a step."""
    pad = [0] * (len(seeds) % 2)
    host = torch.tensor([seeds + pad, steps + pad], dtype=torch.int64)
    keys = host.to(device, non_blocking=True)[:, : len(seeds)]
    return keys[0], keys[1]
