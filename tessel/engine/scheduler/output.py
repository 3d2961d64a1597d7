"""What the scheduler decided for one step: plain data handed to the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tessel.engine.request import Request


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: compute its tokens ``[start, start + num_new_tokens)``."""

    request: Request
    num_new_tokens: int  # tokens to compute this step (a prompt chunk, or 1 for a decode)
    start: int  # request.num_computed_tokens at schedule time: the first position computed
    table_row: int  # the request's row in the SchedulerOutput's block_tables array
    num_blocks: int  # its blocks after allocation: the row's first num_blocks columns
    # Plain fields, not properties: read several times per request per step at full batch.
    num_tokens: int = field(init=False)  # request.num_tokens at schedule time
    request_id: str = field(init=False)

    def __post_init__(self) -> None:
        request = self.request
        self.num_tokens = len(request.prompt_token_ids) + len(request.output_token_ids)
        self.request_id = request.request_id

    @property
    def samples(self) -> bool:
        """Whether this step reaches the request's last known token, so its logits are
        sampled into a new token; a prompt chunk short of the end samples nothing."""
        return self.start + self.num_new_tokens == self.num_tokens

    @property
    def is_prefill(self) -> bool:
        """Whether any prompt token is computed this step (first chunk, later chunk, or
        the recompute of a preempted request)."""
        return self.start < self.request.num_prompt_tokens


@dataclass
class SchedulerOutput:
    """Everything the runner needs for one step, in the order it should batch them."""

    scheduled: list[ScheduledRequest]  # running requests first, then newly admitted ones
    num_batched_tokens: int  # sum of num_new_tokens: at most max_num_batched_tokens
    # [rows, cols] int32 block ids, a row per request holding blocks, 0 past its last block.
    # Valid until the next schedule: stage 1 gathers the step's rows from it.
    block_tables: np.ndarray
    preempted: list[str] = field(default_factory=list)  # ids whose KV was freed this step
    finished_ids: list[str] = field(default_factory=list)  # ids finished since the last step

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
