"""Per-step sampling tensors for a batch of requests, built once and read by the ``Sampler``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from tessel.engine.request import Request
from tessel.engine.sampling_params import SamplingParams, SamplingParamsError

# Temperatures below this are treated as greedy: dividing logits by them overflows float32.
GREEDY_TEMPERATURE = 1e-5


@dataclass
class TokenEdits:
    """Sparse (row, token) positions of a [B, V] logits tensor, with a value for each."""

    rows: torch.Tensor  # [N] long, batch row
    token_ids: torch.Tensor  # [N] long, vocabulary column
    values: torch.Tensor  # [N] float32: the bias to add, or unused for bans


@dataclass
class TruncationTensors:
    """top-k / top-p for the random rows that set either: only these rows get sorted."""

    rows: torch.Tensor  # [T] long, which batch rows these are
    top_k: torch.Tensor | None  # [T] long, vocab_size where off; None when no row sets top_k
    max_top_k: int  # largest top_k among the rows (vocab_size for a row without one)
    top_p: torch.Tensor | None  # [T] float32, 1.0 where off; None when no row sets top_p


@dataclass
class PenaltyTensors:
    """Penalties for the subset of rows that use any; other rows are left alone."""

    rows: torch.Tensor  # [R] long, which batch rows these are
    repetition: torch.Tensor | None  # [R] float32; None when no row sets repetition_penalty
    presence: torch.Tensor  # [R] float32
    frequency: torch.Tensor  # [R] float32
    output_counts: torch.Tensor  # [R, V] float32, times each token appears in the output
    prompt_mask: torch.Tensor | None  # [R, V] bool, token appears in the prompt (repetition only)


@dataclass
class SamplingMetadata:
    """Everything the sampler needs for one step; optional tensors are None when no row uses them."""

    request_ids: list[str]  # one per row, keys the sampler's seeded generators
    seeds: list[int | None]  # params.seed per row
    greedy: torch.Tensor  # [B] bool: take the argmax of the processed logits
    all_greedy: bool  # skip temperature / top-k / top-p / min-p and the random draw entirely
    temperature: torch.Tensor | None  # [B] float32, 1.0 on greedy rows
    inv_temperature: torch.Tensor | None  # [B] float32, 1 / temperature, 0.0 on greedy rows
    output_lengths: list[int]  # tokens each row's request has generated: the step its draw is keyed by
    truncation: TruncationTensors | None  # top-k / top-p
    min_p: torch.Tensor | None  # [B] float32, 0.0 where off
    logit_bias: TokenEdits | None  # OpenAI logit_bias, added to the logits
    banned: TokenEdits | None  # eos + stop ids of rows still short of min_tokens, set to -inf
    penalties: PenaltyTensors | None
    num_logprobs: list[int | None]  # params.logprobs per row
    max_num_logprobs: int | None  # None: no row wants logprobs, skip the log_softmax

    @classmethod
    def build(
        cls, requests: list[Request], vocab_size: int, device: torch.device | str
    ) -> SamplingMetadata:
        """Gather the rows' settings; only tensors some row needs are built."""
        params = [r.params for r in requests]
        greedy = [p.temperature < GREEDY_TEMPERATURE for p in params]
        all_greedy = all(greedy)
        num_logprobs = [p.logprobs for p in params]
        wanted = [n for n in num_logprobs if n is not None]

        def column(values: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

        temperature = inv_temperature = truncation = min_p = None
        if not all_greedy:
            temperature = column(
                [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)],
                torch.float32,
            )
            inv_temperature = column(
                [0.0 if g else 1.0 / p.temperature for p, g in zip(params, greedy, strict=True)],
                torch.float32,
            )
            truncation = _truncation(params, greedy, vocab_size, device)
            if any(p.min_p > 0.0 for p in params):
                min_p = column([p.min_p for p in params], torch.float32)
        return cls(
            request_ids=[r.request_id for r in requests],
            seeds=[p.seed for p in params],
            greedy=column(greedy, torch.bool),
            all_greedy=all_greedy,
            temperature=temperature,
            inv_temperature=inv_temperature,
            output_lengths=[r.num_output_tokens for r in requests],
            truncation=truncation,
            min_p=min_p,
            logit_bias=_logit_bias(params, vocab_size, device),
            banned=_min_tokens_bans(requests, vocab_size, device),
            penalties=_penalties(requests, vocab_size, device),
            num_logprobs=num_logprobs,
            max_num_logprobs=max(wanted) if wanted else None,
        )


def check_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """Reject token ids outside the vocabulary; call when a request is admitted, not per step."""
    for name, ids in (
        ("logit_bias", params.logit_bias or {}),
        ("stop_token_ids", params.stop_token_ids),
    ):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise SamplingParamsError(name, f"has token ids outside [0, {vocab_size}): {bad[:5]}")


def _truncation(
    params: list[SamplingParams], greedy: list[bool], vocab_size: int, device: torch.device | str
) -> TruncationTensors | None:
    rows = [
        row
        for row, (p, g) in enumerate(zip(params, greedy, strict=True))
        if not g and (p.top_k > 0 or p.top_p < 1.0)
    ]
    if not rows:
        return None
    chosen = [params[row] for row in rows]
    ks = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in chosen]
    return TruncationTensors(
        rows=torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True),
        top_k=(
            torch.tensor(ks, dtype=torch.long).to(device, non_blocking=True)
            if any(p.top_k > 0 for p in chosen)
            else None
        ),
        max_top_k=max(ks),
        top_p=(
            torch.tensor([p.top_p for p in chosen]).to(device, non_blocking=True)
            if any(p.top_p < 1.0 for p in chosen)
            else None
        ),
    )


def _edits(
    rows: list[int], token_ids: list[int], values: list[float] | None, device: torch.device | str
) -> TokenEdits | None:
    if not rows:
        return None
    vals = values if values is not None else [0.0] * len(rows)
    return TokenEdits(
        rows=torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True),
        token_ids=torch.tensor(token_ids, dtype=torch.long).to(device, non_blocking=True),
        values=torch.tensor(vals, dtype=torch.float32).to(device, non_blocking=True),
    )


def _logit_bias(
    params: list[SamplingParams], vocab_size: int, device: torch.device | str
) -> TokenEdits | None:
    rows: list[int] = []
    tokens: list[int] = []
    values: list[float] = []
    for row, p in enumerate(params):
        for token, bias in (p.logit_bias or {}).items():
            if 0 <= token < vocab_size:  # out-of-range ids are rejected at admission
                rows.append(row)
                tokens.append(token)
                values.append(bias)
    return _edits(rows, tokens, values, device)


def _min_tokens_bans(
    requests: list[Request], vocab_size: int, device: torch.device | str
) -> TokenEdits | None:
    rows: list[int] = []
    tokens: list[int] = []
    for row, r in enumerate(requests):
        if r.num_output_tokens >= r.params.min_tokens:
            continue
        stops = set(r.params.stop_token_ids)
        if r.eos_token_id is not None and not r.params.ignore_eos:
            stops.add(r.eos_token_id)
        for token in stops:
            if 0 <= token < vocab_size:
                rows.append(row)
                tokens.append(token)
    return _edits(rows, tokens, None, device)


def _token_presence(
    id_lists: list[list[int]], vocab_size: int, device: torch.device | str
) -> torch.Tensor:
    """[len(id_lists), V] float32 counts, scattered on the device without a per-token Python loop."""
    lengths = torch.tensor([len(ids) for ids in id_lists], dtype=torch.long)
    rows = torch.repeat_interleave(torch.arange(len(id_lists)), lengths).to(device)
    flat = np.fromiter(chain.from_iterable(id_lists), dtype=np.int64, count=int(lengths.sum()))
    ids = torch.from_numpy(flat).to(device)
    counts = torch.zeros(len(id_lists), vocab_size, dtype=torch.float32, device=device)
    # scatter_add_ on the flat view: atomics, where index_put_(accumulate=True) sorts on CUDA.
    counts.view(-1).scatter_add_(
        0, rows * vocab_size + ids, torch.ones_like(ids, dtype=torch.float32)
    )
    return counts


def _penalties(
    requests: list[Request], vocab_size: int, device: torch.device | str
) -> PenaltyTensors | None:
    chosen = [
        (row, r)
        for row, r in enumerate(requests)
        if r.params.repetition_penalty != 1.0
        or r.params.presence_penalty != 0.0
        or r.params.frequency_penalty != 0.0
    ]
    if not chosen:
        return None
    subset = [r for _, r in chosen]

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32).to(device, non_blocking=True)

    repetition = prompt_mask = None
    if any(r.params.repetition_penalty != 1.0 for r in subset):
        repetition = column([r.params.repetition_penalty for r in subset])
        prompt_mask = _token_presence([r.prompt_token_ids for r in subset], vocab_size, device) > 0
    return PenaltyTensors(
        rows=torch.tensor([row for row, _ in chosen], dtype=torch.long).to(device),
        repetition=repetition,
        presence=column([r.params.presence_penalty for r in subset]),
        frequency=column([r.params.frequency_penalty for r in subset]),
        output_counts=_token_presence([r.output_token_ids for r in subset], vocab_size, device),
        prompt_mask=prompt_mask,
    )
