"""What the scheduler decided for one step: plain data handed to the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from tessel.engine.request import Request


@dataclass
class ScheduledRequest:
    """One request's share of a step: compute its tokens ``[start, start + num_new_tokens)``."""

    request: Request
    num_new_tokens: int  # tokens to compute this step (a prompt chunk, or 1 for a decode)
    start: int  # request.num_computed_tokens at schedule time: the first position computed
    block_table: list[int]  # the request's block ids after allocation, in token order
    num_tokens: int = field(init=False)  # request.num_tokens at schedule time

    def __post_init__(self) -> None:
        self.num_tokens = self.request.num_tokens

    @property
    def request_id(self) -> str:
        return self.request.request_id

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
    preempted: list[str] = field(default_factory=list)  # ids whose KV was freed this step
    finished_ids: list[str] = field(default_factory=list)  # ids finished since the last step

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
