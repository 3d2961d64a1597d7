"""Stage 1 of a step: the scheduler's decision -> flat input arrays in a pinned buffer set.

The same packing as ``input_batch.build_model_inputs`` (every request's new tokens laid end to
end), written into preallocated host buffers, plus what overlap scheduling needs: a token the
previous step sampled but the host has not seen yet is a ``PLACEHOLDER`` in the request, and its
input row is filled on the device from that step's sampled ids (``prev_src`` -> ``prev_dst``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, compress

import numpy as np

from tessel.engine.runner.buffers import StepBuffers
from tessel.engine.runner.input_batch import PromptLogprobRows
from tessel.engine.scheduler.output import ScheduledRequest
from tessel.kernels.attention.decode_plan import DecodePlan, StaticDecodePlan

PLACEHOLDER = -1
"""Stands in ``request.output_token_ids`` for a token still on the device (overlap scheduling)."""


@dataclass
class PreparedStep:
    """What stage 1 produced besides the buffers' contents: host-side facts about the step."""

    buffers: StepBuffers
    num_tokens: int  # rows of the flat batch (padded rows included)
    batch: int  # requests (padded ones included)
    num_real: int  # scheduled requests, before padding
    max_query_len: int
    max_seq_len: int
    block_width: int  # columns of the block table
    seq_lens: np.ndarray  # [batch] int32, host (padded rows are 1)
    sampling: list[ScheduledRequest]  # requests behind logits_indices, in order
    prompt_logprobs: list[PromptLogprobRows] = field(default_factory=list)
    graph_batch: int | None = None  # captured size this decode step replays, None: eager
    plan: DecodePlan | None = None  # the decode tile plan (host part; device part after stage 2)
    num_from_prev: int = 0  # input rows taken from the previous step's sampled ids

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def prepare_step(
    scheduled: list[ScheduledRequest],
    block_tables: np.ndarray,
    buf: StepBuffers,
    block_size: int,
    prev_rows: dict[str, int],
    graph_batch: int | None = None,
    static_plan: StaticDecodePlan | None = None,
) -> PreparedStep:
    """Fill ``buf`` for ``scheduled``, whose block tables are rows of ``block_tables`` (the
    scheduler's array); ``prev_rows`` maps request id -> row of the previous
    step's sampled ids, for requests whose last token is still a placeholder.
    ``graph_batch`` pads a decode-only step to a captured size (seq_len 1, slot -1)."""
    n_real = len(scheduled)
    batch = graph_batch or n_real
    lens = np.ones(batch, dtype=np.int64)
    starts = np.zeros(batch, dtype=np.int64)
    lens[:n_real] = np.fromiter((s.num_new_tokens for s in scheduled), dtype=np.int64, count=n_real)
    starts[:n_real] = np.fromiter((s.start for s in scheduled), dtype=np.int64, count=n_real)
    qsl = np.zeros(batch + 1, dtype=np.int64)
    np.cumsum(lens, out=qsl[1:])
    total = int(qsl[-1])
    positions = np.arange(total, dtype=np.int64) - np.repeat(qsl[:-1] - starts, lens)
    # One flat gather each for tokens and block ids: a per-request numpy assignment costs
    # ~1 us apiece, which at a few hundred requests is a visible share of a decode step.
    width = max(s.num_blocks for s in scheduled)
    tables = buf.reserve("block_tables", batch * width).reshape(batch, width)
    rows = np.fromiter((s.table_row for s in scheduled), dtype=np.int64, count=n_real)
    np.take(block_tables[:, :width], rows, axis=0, out=tables[:n_real])
    tables[n_real:] = 0
    real = int(qsl[n_real])
    ids = np.zeros(total, dtype=np.int64)
    ids[:real] = np.fromiter(
        chain.from_iterable(s.request.token_slice(s.start, s.start + s.num_new_tokens) for s in scheduled),
        dtype=np.int64, count=real,
    )
    last_rows = qsl[1 : n_real + 1] - 1
    dst = last_rows[ids[last_rows] == PLACEHOLDER]
    src = [prev_rows[scheduled[i].request_id] for i in np.searchsorted(last_rows, dst).tolist()]
    samples = np.fromiter((s.samples for s in scheduled), dtype=bool, count=n_real)
    sampling = list(compress(scheduled, samples))
    prompt_rows: list[PromptLogprobRows] = []
    for i, s in enumerate(scheduled):
        if s.request.params.prompt_logprobs is not None:
            _prompt_logprob_rows(s, int(qsl[i]), prompt_rows)
    seq_lens = (starts + lens).astype(np.int32)
    slots = np.full(total, -1, dtype=np.int64)
    row_of = np.repeat(np.arange(n_real), lens[:n_real])
    pos = positions[:real]
    slots[:real] = tables[row_of, pos // block_size] * block_size + pos % block_size
    buf.write("input_ids", ids)
    buf.write("positions", positions)
    buf.write("slot_mapping", slots)
    buf.write("query_start_loc", qsl.astype(np.int32))
    buf.write("seq_lens", seq_lens)
    buf.write("logits_indices", last_rows[samples])
    buf.write("prev_src", np.asarray(src, dtype=np.int64))
    buf.write("prev_dst", dst)
    step = PreparedStep(
        buf, total, batch, n_real, int(lens.max()), int(seq_lens.max()), width, seq_lens,
        sampling, prompt_rows, graph_batch, num_from_prev=len(src),
    )
    if static_plan is not None and step.is_decode_only:
        size = static_plan.size
        step.plan = static_plan.plan(seq_lens, buf.reserve("decode_plan", size))
    return step


def _prompt_logprob_rows(s: ScheduledRequest, row0: int, out: list[PromptLogprobRows]) -> None:
    """Rows of a prefill chunk that score the request's own next prompt token (echo)."""
    if s.request.params.prompt_logprobs is None:
        return
    last_scored = min(s.start + s.num_new_tokens, s.request.num_prompt_tokens - 1)
    if s.start < last_scored:
        targets = s.request.prompt_token_ids[s.start + 1 : last_scored + 1]
        rows = slice(row0, row0 + len(targets))
        out.append(
            PromptLogprobRows(s.request_id, rows, s.start + 1, targets, s.request.params.prompt_logprobs or 0)
        )
