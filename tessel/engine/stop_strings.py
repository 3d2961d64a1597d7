"""Stop-string matching on streamed text: where a stop starts, and how much tail to hold back."""

from __future__ import annotations


def find_stop_string(text: str, stops: list[str]) -> tuple[int, str] | None:
    """The earliest (start, stop) occurrence of any stop string in ``text``; ties go to the
    stop listed first."""
    best: tuple[int, str] | None = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0 and (best is None or start < best[0]):
            best = (start, stop)
    return best


def partial_stop_length(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string:
    text that must not be streamed yet because the next tokens could complete a stop."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest
