"""The engine's plain stats; the server turns them into Prometheus metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    tensor_parallel_size: int = 1  # ranks the model is split across
    kv_cache_bytes: int = 0  # KV-cache memory allocated, summed over every rank
    # ---- the step pipeline (engine/runner/pipeline.py); seconds, summed over steps ----------
    steps_total: int = 0  # engine steps completed
    stage_seconds_total: dict[str, float] = field(default_factory=dict)  # prepare/copy/compute/aggregate/return
    last_step_stage_ms: dict[str, float] = field(default_factory=dict)  # the last step's stages
    gpu_idle_seconds_total: float = 0.0  # device idle between one step's end and the next's compute
    last_gpu_idle_ms: float = 0.0
    decode_plan_imbalance: float = 0.0  # last decode step's plan: max bucket load / mean - 1
    decode_plan_imbalance_mean: float = 0.0  # mean over decode steps
    cuda_graph_steps_total: int = 0  # steps replayed from a CUDA graph
    wasted_tokens_total: int = 0  # tokens computed for requests that had stopped (overlap)
    # ---- mixture of experts (empty / 0 for a dense model) ----------------------------------
    expert_tokens_total: tuple[int, ...] = ()  # tokens routed to each expert, summed over MoE layers
    expert_load_imbalance: float = 0.0  # last step: worst MoE layer's busiest expert / its mean (1 = even)


class PipelineStats:
    """Running totals of the step pipeline's timings, folded into ``EngineStats``."""

    def __init__(self) -> None:
        self.steps = 0
        self.stage_seconds: dict[str, float] = {}
        self.last_ms: dict[str, float] = {}
        self.gpu_idle = 0.0
        self.last_idle = 0.0
        self.imbalance_last = 0.0
        self.imbalance_sum = 0.0
        self.plan_steps = 0
        self.graph_steps = 0
        self.wasted_tokens_total = 0

    def record(self, timing: Any, num_scheduled: int) -> None:
        """Fold one completed step's ``StepTiming`` in."""
        self.steps += 1
        for name, sec in timing.stages.items():
            self.stage_seconds[name] = self.stage_seconds.get(name, 0.0) + sec
        self.last_ms = {k: v * 1e3 for k, v in timing.stages.items()}
        self.gpu_idle += timing.gpu_idle_before
        self.last_idle = timing.gpu_idle_before
        if timing.plan_imbalance is not None:
            self.imbalance_last = timing.plan_imbalance
            self.imbalance_sum += timing.plan_imbalance
            self.plan_steps += 1
        self.graph_steps += int(timing.graph)

    def snapshot(self) -> dict[str, Any]:
        return {
            "steps_total": self.steps,
            "stage_seconds_total": dict(self.stage_seconds),
            "last_step_stage_ms": dict(self.last_ms),
            "gpu_idle_seconds_total": self.gpu_idle,
            "last_gpu_idle_ms": self.last_idle * 1e3,
            "decode_plan_imbalance": self.imbalance_last,
            "decode_plan_imbalance_mean": self.imbalance_sum / max(self.plan_steps, 1),
            "cuda_graph_steps_total": self.graph_steps,
            "wasted_tokens_total": self.wasted_tokens_total,
        }


class ExpertLoadStats:
    """Running totals of a MoE model's routing, folded into ``EngineStats``.

    Counts are summed over layers: one series per expert keeps the metric's cardinality at the
    expert count (128 for Qwen3-30B-A3B, not 48 x 128). Imbalance is taken per layer first, then
    the worst layer: a step waits for its slowest layer's busiest expert, and summing layers
    first would average a hot expert in one layer against cold ones in others.
    """

    def __init__(self, num_experts: int) -> None:
        self.tokens_total = [0] * num_experts
        self.last_imbalance = 0.0

    def record(self, per_layer: list[list[int]]) -> None:
        """Fold one step's ``[MoE layer][expert]`` counts in."""
        worst = 0.0
        for counts in per_layer:
            self.tokens_total = [t + c for t, c in zip(self.tokens_total, counts, strict=True)]
            routed = sum(counts)
            if routed:
                worst = max(worst, max(counts) * len(counts) / routed)
        self.last_imbalance = worst

    def snapshot(self) -> dict[str, Any]:
        return {"expert_tokens_total": tuple(self.tokens_total), "expert_load_imbalance": self.last_imbalance}
