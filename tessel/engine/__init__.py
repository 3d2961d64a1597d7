"""The inference engine: models, KV cache, scheduler, sampler, the offline and async APIs.

Knows nothing of HTTP. The public names load lazily, so importing a small piece
(``engine.kv_cache``, ``engine.sampling_params``) does not pull in the model stack.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "LLM": "tessel.engine.llm",
    "AsyncEngine": "tessel.engine.async_engine",
    "CompletionOutput": "tessel.engine.request",
    "Logprob": "tessel.engine.request",
    "RequestOutput": "tessel.engine.request",
    "SamplingParams": "tessel.engine.sampling_params",
    "EngineStats": "tessel.engine.stats",
}

if TYPE_CHECKING:
    from tessel.engine.async_engine import AsyncEngine
    from tessel.engine.llm import LLM
    from tessel.engine.request import CompletionOutput, Logprob, RequestOutput
    from tessel.engine.sampling_params import SamplingParams
    from tessel.engine.stats import EngineStats

__all__ = [  # noqa: F822 - resolved lazily by __getattr__
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "EngineStats",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(import_module(module), name)
