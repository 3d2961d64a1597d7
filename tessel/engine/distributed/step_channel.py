"""Rank 0 -> workers: each step's prepared inputs, and the ids rank 0 sampled.

Stage 1 runs once, on rank 0; what it wrote into its pinned buffers (the flat token rows,
positions, slots, block tables, logits rows, overlap's placeholder rows) is broadcast on the
control group as one int64 header and one int64 payload, and each worker writes it into its own
buffers. The decode tile plan is not sent: it depends only on ``seq_lens``, so each worker
computes it itself (attention is local to each rank's heads). After sampling, rank 0 broadcasts
the sampled ids on the data group, so overlap scheduling's next step finds them on every device.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from tessel.engine.distributed.group import TensorParallelGroup
from tessel.engine.runner.buffers import StepBuffers
from tessel.engine.runner.input_batch import PromptLogprobRows
from tessel.engine.runner.step_inputs import PreparedStep
from tessel.kernels.attention.decode_plan import StaticDecodePlan

FIELDS = (
    "input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "block_tables",
    "logits_indices", "prev_src", "prev_dst",
)  # fmt: skip
_STOP, _STEP = 0, 1
# kind, num_tokens, batch, num_real, max_query_len, max_seq_len, block_width, graph_batch,
# num_from_prev, prompt-logprob chunks, then one length per field
_SCALARS = 10
HEADER_LEN = _SCALARS + len(FIELDS)


class StepChannel:
    """Both ends of the per-step broadcasts; rank 0 calls ``send*``, workers ``receive*``."""

    def __init__(self, group: TensorParallelGroup) -> None:
        self.group = group
        self._header = torch.zeros(HEADER_LEN, dtype=torch.int64)

    # ---- rank 0 -------------------------------------------------------------------------

    def send(self, step: PreparedStep) -> None:
        buf = step.buffers
        parts = [buf.host_view(name) for name in FIELDS]
        rows = [r for c in step.prompt_logprobs for r in (c.rows.start, c.rows.stop)]
        header = [
            _STEP, step.num_tokens, step.batch, step.num_real, step.max_query_len,
            step.max_seq_len, step.block_width, step.graph_batch or 0, step.num_from_prev,
            len(step.prompt_logprobs), *(len(p) for p in parts),
        ]  # fmt: skip
        payload = np.concatenate([*(p.astype(np.int64) for p in parts), np.asarray(rows, np.int64)])
        self._header.copy_(torch.tensor(header, dtype=torch.int64))
        self.group.send_control(self._header)
        self.group.send_control(torch.from_numpy(payload))

    def send_stop(self) -> None:
        """Tell every worker to leave its step loop."""
        self._header.zero_()
        self.group.send_control(self._header)

    def send_sampled(self, tokens: torch.Tensor) -> None:
        dist.broadcast(tokens, src=0)

    # ---- workers ------------------------------------------------------------------------

    def receive(self, buf: StepBuffers, static_plan: StaticDecodePlan | None) -> PreparedStep | None:
        """The next step, written into ``buf``; None when rank 0 said stop."""
        dist.broadcast(self._header, src=0, group=self.group.control)
        h = self._header.tolist()
        if h[0] == _STOP:
            return None
        lengths, num_chunks = h[_SCALARS:], h[9]
        payload = torch.empty(sum(lengths) + 2 * num_chunks, dtype=torch.int64)
        dist.broadcast(payload, src=0, group=self.group.control)
        values, offset = payload.numpy(), 0
        for name, n in zip(FIELDS, lengths, strict=True):
            buf.write(name, values[offset : offset + n])
            offset += n
        bounds = values[offset:].tolist()
        chunks = [
            PromptLogprobRows("", slice(bounds[2 * i], bounds[2 * i + 1]), 0, [], 0)
            for i in range(num_chunks)
        ]
        step = PreparedStep(
            buf, h[1], h[2], h[3], h[4], h[5], h[6], buf.host_view("seq_lens").copy(), [],
            chunks, h[7] or None, num_from_prev=h[8],
        )
        if static_plan is not None and step.is_decode_only:
            step.plan = static_plan.plan(step.seq_lens, buf.reserve("decode_plan", static_plan.size))
        return step

    def receive_sampled(self, n: int, device: torch.device) -> torch.Tensor:
        tokens = torch.empty(n, dtype=torch.int64, device=device)
        dist.broadcast(tokens, src=0)
        return tokens
