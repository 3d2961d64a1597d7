"""The inference engine: models, KV cache, scheduler, sampler, the offline and async APIs.

Knows nothing of HTTP.
"""

from engine.async_engine import AsyncEngine
from engine.llm import LLM
from engine.request import CompletionOutput, Logprob, RequestOutput
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "EngineStats",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
]
