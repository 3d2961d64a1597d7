"""A snapshot of the scheduler's state, which the server turns into metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerStats:
    """Gauges and counters read once per step; counters only grow."""

    num_running: int  # requests holding KV and scheduled step after step
    num_waiting: int  # requests queued, preempted ones included
    kv_blocks_used: int  # blocks held by some request
    kv_blocks_total: int  # usable blocks (the null block excluded)
    prefix_cache_queries: int  # tokens looked up in the prefix cache (counter)
    prefix_cache_hits: int  # of those, tokens served from it (counter)
    num_preemptions: int  # requests preempted so far (counter)
    num_scheduled_tokens: int  # tokens scheduled by the last step

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
