"""Sampling fields shared by /v1/completions and /v1/chat/completions, and their check.

Types are checked by pydantic (a wrong type is a 400 naming the field); ranges are checked
once, by ``engine.SamplingParams``, whose ``SamplingParamsError.param`` names the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from tessel.engine.sampling_params import SamplingParams, SamplingParamsError
from tessel.server.protocol.errors import APIError

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for logit_bias values
BYTES_PER_TOKEN = 4  # BPE tokenizers average about 4 bytes of English per token


def estimate_tokens(text: str) -> int:
    """A prompt's token count guessed from its size, for admission before tokenizing."""
    return 1 + len(text.encode("utf-8", "replace")) // BYTES_PER_TOKEN


class StreamOptions(BaseModel):
    include_usage: StrictBool = False
    """Send a last chunk with ``choices: []`` and the usage before ``[DONE]``."""


class SamplingRequest(BaseModel):
    """The fields every generation request shares; ``None`` means OpenAI's default."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)  # JSON's NaN/Infinity: 400

    model: str | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    user: str | None = None
    # Common extensions (vLLM's names).
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: StrictBool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    timeout: float | None = Field(default=None, gt=0)
    """Tessel's extension: seconds this request may take (the server's limit still holds)."""

    @model_validator(mode="before")
    @classmethod
    def _strings_are_utf8(cls, data: Any) -> Any:
        check_utf8(data)
        return data

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise APIError(
                400, "stream_options is only allowed with stream: true", "stream_options"
            )

    def sampling_params(
        self,
        vocab_size: int,
        max_tokens: int | None,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        rename: dict[str, str] | None = None,
    ) -> SamplingParams:
        """Build and range-check the engine's params; errors name the request's own field."""
        n = 1 if self.n is None else self.n
        kwargs: dict[str, Any] = {
            "n": n,
            "max_tokens": max_tokens,
            "min_tokens": _or(self.min_tokens, 0),
            "temperature": _or(self.temperature, 1.0),
            "top_p": _or(self.top_p, 1.0),
            "top_k": _or(self.top_k, 0),
            "min_p": _or(self.min_p, 0.0),
            "presence_penalty": _or(self.presence_penalty, 0.0),
            "frequency_penalty": _or(self.frequency_penalty, 0.0),
            "repetition_penalty": _or(self.repetition_penalty, 1.0),
            "logit_bias": _logit_bias(self.logit_bias, vocab_size),
            "seed": self.seed,
            "stop": self.stop_strings,
            "stop_token_ids": _token_ids(self.stop_token_ids, vocab_size, "stop_token_ids"),
            "ignore_eos": self.ignore_eos,
            "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
        }
        try:
            return SamplingParams(**kwargs)
        except SamplingParamsError as err:
            param = (rename or {}).get(err.param, err.param)
            message = str(err).removeprefix(err.param).strip()
            raise APIError(400, f"{param} {message}", param) from err


def check_utf8(data: Any, path: str = "") -> None:
    """400 naming the field when a string of the body cannot be UTF-8 (a lone surrogate such as
    ``"\\ud800"`` is valid JSON but no text): the tokenizer and the response could not hold it."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            field = path.split(".")[0] or None
            raise APIError(
                400, f"{path or 'body'}: the string is not valid Unicode (a lone surrogate)", field
            ) from None
    elif isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            check_utf8(key, where)
            check_utf8(value, where)
    elif isinstance(data, list):
        for index, value in enumerate(data):
            check_utf8(value, f"{path}.{index}" if path else str(index))


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _token_ids(ids: list[int] | None, vocab_size: int, param: str) -> list[int]:
    for token_id in ids or []:
        if not 0 <= token_id < vocab_size:
            raise APIError(400, f"{param}: token id {token_id} is not in [0, {vocab_size})", param)
    return list(ids or [])


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise APIError(
                400, f"logit_bias keys must be token ids, got {key!r}", "logit_bias"
            ) from None
        _token_ids([token_id], vocab_size, "logit_bias")
        if not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
            raise APIError(
                400, f"logit_bias values must be in [-100, 100], got {value}", "logit_bias"
            )
        out[token_id] = value
    return out
