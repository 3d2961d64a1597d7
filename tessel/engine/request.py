"""A request's state inside the engine, and what the engine hands back."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tessel.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, its KV freed; it recomputes on resume
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.finished else None


_FINISHED = {
    RequestStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH,
    RequestStatus.FINISHED_ABORTED,
    RequestStatus.FINISHED_ERROR,
}


@dataclass(eq=False)
class Request:
    """One sequence being generated. The scheduler only looks at token counts:
    ``num_computed_tokens`` (KV written) against ``num_tokens`` (prompt + output)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved: params.max_tokens, capped by the context length
    eos_token_id: int | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at first schedule
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    sibling_of: str | None = None  # for n > 1: the first child, whose prompt blocks this one reuses
    num_preemptions: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens ``start:end`` of prompt + output, without building the whole list."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def token_id_at(self, index: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[index] if index < n else self.output_token_ids[index - n]

    @property
    def is_finished(self) -> bool:
        return self.status.finished


@dataclass
class Logprob:
    """Log-probability of one token, with the top alternatives at that position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass
class CompletionOutput:
    """One choice of a request; in a streamed delta, only what is new since the last one."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    stop_reason: int | str | None = None
    logprobs: list[Logprob] | None = None


@dataclass
class RequestMetrics:
    """Timestamps (``time.monotonic``) the metrics layer turns into latencies."""

    arrival_time: float
    scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """What ``LLM.generate`` returns and ``AsyncEngine.generate`` yields."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt: str | None = None
    prompt_logprobs: list[Logprob | None] | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None


def merge_outputs(deltas: Sequence[RequestOutput]) -> RequestOutput:
    """A request's deltas, oldest first, folded into one output in a single pass: each choice's
    text joined, its token ids and logprobs concatenated, its last finish reason kept, choices
    sorted by index. The deltas' own objects are not changed."""
    first, last = deltas[0], deltas[-1]
    choices: dict[int, CompletionOutput] = {}
    texts: dict[int, list[str]] = {}
    prompt_logprobs = first.prompt_logprobs
    for delta in deltas:
        if delta.prompt_logprobs is not None:
            prompt_logprobs = delta.prompt_logprobs
        for d in delta.outputs:
            c = choices.get(d.index)
            if c is None:
                c = choices[d.index] = CompletionOutput(d.index, "", [], logprobs=None if d.logprobs is None else [])
                texts[d.index] = []
            texts[d.index].append(d.text)
            c.token_ids.extend(d.token_ids)
            if d.logprobs is not None:
                c.logprobs = c.logprobs if c.logprobs is not None else []
                c.logprobs.extend(d.logprobs)
            c.finish_reason, c.stop_reason = d.finish_reason, d.stop_reason
    for index, c in choices.items():
        c.text = "".join(texts[index])
    return RequestOutput(
        request_id=first.request_id,
        prompt_token_ids=first.prompt_token_ids,
        outputs=[choices[i] for i in sorted(choices)],
        finished=last.finished,
        prompt=first.prompt,
        prompt_logprobs=prompt_logprobs,
        num_cached_tokens=first.num_cached_tokens,
        metrics=first.metrics,
    )
