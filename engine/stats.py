"""The engine's plain stats; the server turns them into Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineStats:
    num_running: int  # requests scheduled step after step
    num_waiting: int  # queued, preempted ones included
    kv_blocks_used: int
    kv_blocks_total: int
    kv_usage: float  # used / total, 0..1
    prefix_cache_queries_total: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int  # of those, tokens served from it
    preemptions_total: int
    prompt_tokens_total: int  # prompt tokens of admitted requests
    generation_tokens_total: int  # tokens sampled
    num_scheduled_tokens: int  # tokens computed by the last step
    requests_finished_total: dict[str, int] = field(default_factory=dict)  # by finish reason
