"""/v1/chat/completions: the request body and the JSON it answers with."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator
from pydantic_core import PydanticCustomError

from tessel.engine.sampling_params import SamplingParams
from tessel.server.protocol.errors import APIError
from tessel.server.protocol.sampling import SamplingRequest, estimate_tokens

TEMPLATE_TOKENS_PER_MESSAGE = 8  # a role header and separators, as chat templates add them
Role = Literal["system", "developer", "user", "assistant", "tool"]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Role
    content: StrictStr | list[TextPart] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        """An image or audio part would otherwise fail every branch of the union, and pydantic
        would report the first: "Input should be a valid string", which names the wrong thing."""
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise PydanticCustomError(
                    "content_part_type",
                    "content parts of type '{kind}' are not supported; this model takes 'text' parts only",
                    {"kind": kind},
                )
        return content

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingRequest):
    """OpenAI's chat completions request, plus the sampling extensions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    """Deprecated by OpenAI for ``max_completion_tokens``; either is honoured."""
    max_completion_tokens: int | None = None
    logprobs: StrictBool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def check_unsupported(self) -> None:
        self.check_stream_options()
        if self.tools:
            raise APIError(400, "tools are not supported", "tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise APIError(400, "only response_format type 'text' is supported", "response_format")
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")

    def estimated_prompt_tokens(self) -> int:
        """Prompt tokens, estimated without templating or tokenizing."""
        return sum(estimate_tokens(m.text()) + TEMPLATE_TOKENS_PER_MESSAGE for m in self.messages)

    def requested_max_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def template_messages(self) -> list[dict[str, str]]:
        """The messages as the chat template takes them (system for developer)."""
        rendered = []
        for message in self.messages:
            role = "system" if message.role == "developer" else message.role
            rendered.append({"role": role, "content": message.text()})
        return rendered

    def to_sampling_params(self, vocab_size: int) -> SamplingParams:
        use_completion = self.max_completion_tokens is not None
        max_tokens = self.max_completion_tokens if use_completion else self.max_tokens
        return self.sampling_params(
            vocab_size,
            max_tokens=max_tokens,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            rename={
                "logprobs": "top_logprobs",
                "max_tokens": "max_completion_tokens" if use_completion else "max_tokens",
            },
        )


def chat_logprob_entry(token: str, logprob: float, top: list[tuple[str, float]]) -> dict[str, Any]:
    """One entry of ``choices[].logprobs.content``."""
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode("utf-8")),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for t, lp in top
        ],
    }
