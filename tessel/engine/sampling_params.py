"""Per-request sampling settings, validated once when the request is made."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    """What a request wants sampled; field names and defaults follow vLLM and OpenAI."""

    n: int = 1
    max_tokens: int | None = 16  # None: up to the model's context length
    min_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N alternatives per sampled token; 0 = only the sampled one
    prompt_logprobs: int | None = None  # the same for each prompt token (echo)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k == -1:
            self.top_k = 0
        _check(self.n >= 1, "n", f"must be >= 1, got {self.n}")
        _check(
            self.max_tokens is None or self.max_tokens >= 0,
            "max_tokens",
            f"must be >= 0, got {self.max_tokens}",
        )
        _check(self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens}")
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}",
        )
        _check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= 0, "top_k", f"must be -1, 0 or positive, got {self.top_k}")
        _check(0 <= self.min_p <= 1, "min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2 <= value <= 2, name, f"must be in [-2, 2], got {value}")
        _check(
            self.repetition_penalty > 0,
            "repetition_penalty",
            f"must be > 0, got {self.repetition_penalty}",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(
                value is None or 0 <= value <= MAX_LOGPROBS,
                name,
                f"must be in [0, {MAX_LOGPROBS}], got {value}",
            )
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")
        _check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", "must be >= 0")
        # torch generators take a signed 64-bit seed; n > 1 seeds its choices seed + index.
        _check(
            self.seed is None or -(2**63) <= self.seed <= 2**63 - 1 - self.n,
            "seed",
            f"must fit a signed 64-bit integer, got {self.seed}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SamplingParamsError(ValueError):
    """A sampling field is out of range; ``param`` names it for the API error."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param} {message}")
        self.param = param


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise SamplingParamsError(param, message)
