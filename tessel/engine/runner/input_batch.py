"""Stage 1 of a step: turn the scheduler's decision into the model's flat input tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tessel.engine.scheduler.output import ScheduledRequest
from tessel.kernels.attention.metadata import AttentionMetadata


@dataclass
class PromptLogprobRows:
    """Rows of a prefill chunk whose logits score the request's own next prompt token."""

    request_id: str
    rows: slice  # rows of the flat batch
    first_target: int  # prompt index of the token the first row predicts
    targets: list[int]  # the prompt tokens those rows predict, one per row
    num_top: int  # alternatives wanted per position


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    attn: AttentionMetadata
    logits_indices: torch.Tensor  # [S] long: last row of each request that samples this step
    sampling: list[ScheduledRequest]  # the requests behind logits_indices, in order
    prompt_logprobs: list[PromptLogprobRows]


def build_model_inputs(
    scheduled: list[ScheduledRequest], block_size: int, device: torch.device
) -> ModelInputs:
    """Pack every scheduled request's new tokens along one axis (prefill chunks and decodes alike)."""
    lens = np.fromiter((s.num_new_tokens for s in scheduled), dtype=np.int64, count=len(scheduled))
    starts = np.fromiter((s.start for s in scheduled), dtype=np.int64, count=len(scheduled))
    qsl = np.zeros(len(scheduled) + 1, dtype=np.int64)
    np.cumsum(lens, out=qsl[1:])
    total = int(qsl[-1])
    # positions: start, start+1, ... for each request, laid end to end
    positions = np.arange(total, dtype=np.int64) - np.repeat(qsl[:-1] - starts, lens)
    max_blocks = max(len(s.block_table) for s in scheduled)
    tables = np.zeros((len(scheduled), max_blocks), dtype=np.int64)
    input_ids: list[int] = []
    sampling: list[ScheduledRequest] = []
    logits_rows: list[int] = []
    prompt_rows: list[PromptLogprobRows] = []
    for i, s in enumerate(scheduled):
        tables[i, : len(s.block_table)] = s.block_table
        input_ids.extend(s.request.token_slice(s.start, s.start + s.num_new_tokens))
        if s.samples:
            sampling.append(s)
            logits_rows.append(int(qsl[i + 1]) - 1)
        wants_prompt = s.request.params.prompt_logprobs is not None
        last_scored = min(s.start + s.num_new_tokens, s.request.num_prompt_tokens - 1)
        if wants_prompt and s.start < last_scored:
            row0 = int(qsl[i])
            targets = s.request.prompt_token_ids[s.start + 1 : last_scored + 1]
            rows = slice(row0, row0 + len(targets))
            prompt_rows.append(
                PromptLogprobRows(
                    s.request_id, rows, s.start + 1, targets, s.request.params.prompt_logprobs or 0
                )
            )
    seq_lens = starts + lens
    row_of_token = np.repeat(np.arange(len(scheduled)), lens)
    slots = tables[row_of_token, positions // block_size] * block_size + positions % block_size

    def t(a: np.ndarray | list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(a), dtype=dtype).to(device, non_blocking=True)

    md = AttentionMetadata(
        slot_mapping=t(slots, torch.long),
        query_start_loc=t(qsl, torch.int32),
        seq_lens=t(seq_lens, torch.int32),
        block_tables=t(tables, torch.int32),
        max_query_len=int(lens.max()),
        max_seq_len=int(seq_lens.max()),
        block_size=block_size,
        seq_lens_cpu=torch.from_numpy(seq_lens.astype(np.int32)),
    )
    return ModelInputs(
        input_ids=t(input_ids, torch.long),
        positions=t(positions, torch.long),
        attn=md,
        logits_indices=t(logits_rows, torch.long),
        sampling=sampling,
        prompt_logprobs=prompt_rows,
    )
