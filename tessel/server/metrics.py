"""Prometheus metrics: per-request latencies and counts, and the engine's stats at scrape time.

The engine knows nothing of Prometheus: it hands back ``RequestMetrics`` timestamps with each
request and an ``EngineStats`` dataclass from ``stats()``; this file turns both into metrics.
Every app gets its own ``CollectorRegistry`` (tests build several apps in one process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessel.engine.request import RequestMetrics

# Latency buckets from sub-millisecond GPU steps to minutes-long CPU requests.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    320.0,
    640.0,
)
TOKEN_BUCKETS = (
    1,
    2,
    4,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    32768,
    131072,
)
FINISH_REASONS = ("stop", "length", "abort", "error")


class ServerMetrics:
    """All of the server's metrics, in one registry, labelled by ``model_name``."""

    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        labels = ["model_name"]

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

        self.ttft = histogram(
            "tessel_time_to_first_token_seconds", "Arrival to first token.", LATENCY_BUCKETS
        )
        self.tpot = histogram(
            "tessel_time_per_output_token_seconds",
            "Per request: (last token - first token) / (output tokens - 1).",
            LATENCY_BUCKETS,
        )
        self.itl = histogram(
            "tessel_inter_token_latency_seconds",
            "Each gap between two output tokens.",
            LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "tessel_e2e_request_latency_seconds", "Arrival to the last token.", LATENCY_BUCKETS
        )
        self.queue = histogram(
            "tessel_request_queue_time_seconds", "Arrival to first scheduled.", LATENCY_BUCKETS
        )
        self.prompt_len = histogram(
            "tessel_request_prompt_tokens", "Prompt length per request.", TOKEN_BUCKETS
        )
        self.gen_len = histogram(
            "tessel_request_generation_tokens",
            "Generated tokens per request (all choices).",
            TOKEN_BUCKETS,
        )
        self.prompt_tokens = Counter(
            "tessel_prompt_tokens",
            "Prompt tokens of the requests served.",
            labels,
            registry=self.registry,
        )
        self.generation_tokens = Counter(
            "tessel_generation_tokens",
            "Tokens generated for the requests served.",
            labels,
            registry=self.registry,
        )
        self.finished = Counter(
            "tessel_requests_finished",
            "Choices finished, by finish reason (stop, length, abort, error).",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "tessel_requests_rejected",
            "Requests refused before reaching the engine.",
            [*labels, "reason"],
            registry=self.registry,
        )

    def add_engine_collector(self, stats: Callable[[], Any | None]) -> None:
        """Export ``stats()`` (an ``EngineStats`` or None before the model loads) at each scrape."""
        self.registry.register(EngineStatsCollector(stats, lambda: self.model_name))

    def add_server_collector(self, gauges: Callable[[], dict[str, float]]) -> None:
        """Export the server's own gauges (``SERVER_GAUGES`` keys -> value) at each scrape."""
        self.registry.register(ServerGaugeCollector(gauges, lambda: self.model_name))

    def init_labels(self) -> None:
        """Create every known series at 0 once the model's name is known, so dashboards and
        alerts see ``rate() == 0`` rather than no series."""
        for reason in FINISH_REASONS:
            self.finished.labels(self.model_name, reason)
        self.rejections.labels(self.model_name, "queue_full")

    def rejected(self, reason: str) -> None:
        self.rejections.labels(self.model_name, reason).inc()

    def observe_request(
        self,
        metrics: RequestMetrics | None,
        num_prompt_tokens: int,
        num_generated_tokens: int,
        finish_reasons: list[str],
    ) -> None:
        """Record one engine request (one prompt, all its choices) once it has ended."""
        name = self.model_name
        self.prompt_tokens.labels(name).inc(num_prompt_tokens)
        self.generation_tokens.labels(name).inc(num_generated_tokens)
        self.prompt_len.labels(name).observe(num_prompt_tokens)
        self.gen_len.labels(name).observe(num_generated_tokens)
        for reason in finish_reasons:
            self.finished.labels(name, reason).inc()
        if metrics is not None:
            self._observe_timings(metrics)

    def _observe_timings(self, m: RequestMetrics) -> None:
        name = self.model_name
        if m.scheduled_time is not None:
            self.queue.labels(name).observe(max(0.0, m.scheduled_time - m.arrival_time))
        if m.first_token_time is not None:
            self.ttft.labels(name).observe(max(0.0, m.first_token_time - m.arrival_time))
        times = sorted(set(m.token_times))  # n > 1: the choices of one step share a timestamp
        itl = self.itl.labels(name)  # one lookup, not one per token
        for earlier, later in zip(times, times[1:], strict=False):
            itl.observe(max(0.0, later - earlier))
        if len(times) > 1:
            self.tpot.labels(name).observe(max(0.0, (times[-1] - times[0]) / (len(times) - 1)))
        end = m.finished_time if m.finished_time is not None else (times[-1] if times else None)
        if end is not None:
            self.e2e.labels(name).observe(max(0.0, end - m.arrival_time))


class EngineStatsCollector(Collector):
    """Reads the engine's cumulative counters and current gauges when Prometheus scrapes."""

    GAUGES = (
        ("tessel_num_requests_running", "num_running", "Requests in the running batch."),
        ("tessel_num_requests_waiting", "num_waiting", "Requests waiting for a batch slot."),
        ("tessel_kv_cache_usage_perc", "kv_usage", "Fraction of KV-cache blocks in use (0..1)."),
        ("tessel_kv_cache_blocks_used", "kv_blocks_used", "KV-cache blocks held by requests."),
        ("tessel_kv_cache_blocks_capacity", "kv_blocks_total", "KV-cache blocks allocated."),
        (
            "tessel_kv_cache_memory_bytes",
            "kv_cache_bytes",
            "KV-cache memory allocated, summed over every tensor-parallel rank.",
        ),
        (
            "tessel_tensor_parallel_size",
            "tensor_parallel_size",
            "Ranks (processes, one per GPU) the model is split across.",
        ),
        (
            "tessel_engine_decode_plan_imbalance",
            "decode_plan_imbalance",
            "The last decode step's attention plan: busiest bucket's load / mean load - 1.",
        ),
    )
    COUNTERS = (
        (
            "tessel_num_preemptions",
            "preemptions_total",
            "Requests preempted (KV freed, recomputed).",
        ),
        (
            "tessel_prefix_cache_queries",
            "prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
        ),
        (
            "tessel_prefix_cache_hits",
            "prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache.",
        ),
        ("tessel_engine_steps", "steps_total", "Engine steps completed."),
        (
            "tessel_engine_gpu_idle_seconds",
            "gpu_idle_seconds_total",
            "Device time idle between one step's end and the next step's compute.",
        ),
        (
            "tessel_engine_cuda_graph_steps",
            "cuda_graph_steps_total",
            "Engine steps replayed from a captured CUDA graph.",
        ),
        (
            "tessel_engine_wasted_tokens",
            "wasted_tokens_total",
            "Tokens computed for requests that had already stopped (overlap scheduling).",
        ),
    )

    def __init__(self, stats: Callable[[], Any | None], model_name: Callable[[], str]) -> None:
        self._stats = stats
        self._model_name = model_name

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the registry learns the names at the first scrape

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:
            return
        name = self._model_name()
        for metric, attr, doc in self.GAUGES:
            gauge = GaugeMetricFamily(metric, doc, labels=["model_name"])
            gauge.add_metric([name], float(getattr(stats, attr)))
            yield gauge
        for metric, attr, doc in self.COUNTERS:
            counter = CounterMetricFamily(metric, doc, labels=["model_name"])
            counter.add_metric([name], float(getattr(stats, attr)))
            yield counter
        stages = CounterMetricFamily(
            "tessel_engine_step_stage_seconds",
            "Time spent in each stage of the engine step pipeline "
            "(prepare, copy, compute, aggregate, return), summed over steps.",
            labels=["model_name", "stage"],
        )
        for stage, seconds in sorted(stats.stage_seconds_total.items()):
            stages.add_metric([name, stage], float(seconds))
        yield stages
        if stats.expert_tokens_total:  # a mixture-of-experts model; absent for a dense one
            yield from _expert_metrics(stats, name)


MOE_FAMILIES = ("tessel_moe_expert_tokens", "tessel_moe_expert_load_imbalance")
"""Exported only by a mixture-of-experts model."""


def _expert_metrics(stats: Any, name: str) -> Iterator[Metric]:
    # one series per expert id: bounded by the model's expert count, summed over MoE layers
    tokens = CounterMetricFamily(
        MOE_FAMILIES[0],
        "Tokens routed to each expert, summed over the MoE layers (each token counts top_k times per layer).",
        labels=["model_name", "expert"],
    )
    for expert, count in enumerate(stats.expert_tokens_total):
        tokens.add_metric([name, str(expert)], float(count))
    yield tokens
    imbalance = GaugeMetricFamily(
        MOE_FAMILIES[1],
        "Last step: the worst MoE layer's busiest expert's tokens over the mean per expert (1 = even).",
        labels=["model_name"],
    )
    imbalance.add_metric([name], float(stats.expert_load_imbalance))
    yield imbalance


SERVER_GAUGES = (
    ("tessel_api_requests_in_flight", "in_flight", "HTTP generation requests admitted, not done."),
    ("tessel_api_requests_queued", "queued", "Admitted requests with no output yet."),
    ("tessel_api_queued_prompt_tokens", "queued_tokens", "Prompt tokens of those requests."),
    ("tessel_engine_stalled", "stalled", "1 while the watchdog sees work pending, no step done."),
)


class ServerGaugeCollector(Collector):
    """The HTTP layer's admission and health gauges, read when Prometheus scrapes."""

    def __init__(
        self, gauges: Callable[[], dict[str, float]], model_name: Callable[[], str]
    ) -> None:
        self._gauges = gauges
        self._model_name = model_name

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        values = self._gauges()
        name = self._model_name()
        for metric, key, doc in SERVER_GAUGES:
            gauge = GaugeMetricFamily(metric, doc, labels=["model_name"])
            gauge.add_metric([name], float(values[key]))
            yield gauge
