"""What stage 1 records about a prefill chunk's prompt logprobs, shared with the TP channel."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PromptLogprobRows:
    """Rows of a prefill chunk whose logits score the request's own next prompt token."""

    request_id: str
    rows: slice  # rows of the flat batch
    first_target: int  # prompt index of the token the first row predicts
    targets: list[int]  # the prompt tokens those rows predict, one per row
    num_top: int  # alternatives wanted per position
