"""The envelope every completion and chat response (or stream chunk) shares."""

from __future__ import annotations

from typing import Any

COMPLETION = "text_completion"  # OpenAI uses it for bodies and chunks alike
CHAT_COMPLETION = "chat.completion"
CHAT_COMPLETION_CHUNK = "chat.completion.chunk"


def usage_body(num_prompt: int, num_completion: int) -> dict[str, int]:
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }


def response_body(
    kind: str,
    request_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``{"id", "object": kind, "created", "model", "choices", ...}``; ``usage`` when given."""
    body: dict[str, Any] = {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
        "system_fingerprint": None,
    }
    if usage is not None:
        body["usage"] = usage
    return body
