"""Where a decode step's time goes at a given batch: per-step records of the engine's stage timers
(host wall time between steps, GPU compute / aggregate / idle from events, host prepare / return),
and torch.profiler's kernel times over steps where every request is decoding.

Only steps that replayed a CUDA graph with the whole batch scheduled count, so prefill and the
tail of a run (requests finishing) stay out of the medians.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from statistics import median
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


@contextmanager
def step_records(llm: Any) -> Iterator[list[dict[str, Any]]]:
    """Every completed step while inside: wall time it completed, stage seconds, GPU idle before
    it, requests scheduled, graph replayed."""
    stats = llm.core.step_stats
    original = stats.record
    records: list[dict[str, Any]] = []

    def record(timing: Any, num_scheduled: int) -> None:
        original(timing, num_scheduled)
        records.append({"t": time.perf_counter(), "stages": dict(timing.stages), "idle": timing.gpu_idle_before,
                        "batch": num_scheduled, "graph": timing.graph})

    stats.record = record
    try:
        yield records
    finally:
        del stats.record  # back to the class's method


@contextmanager
def timed_calls(targets: dict[str, tuple[Any, str]]) -> Iterator[dict[str, float]]:
    """While inside, every call of ``getattr(owner, attr)`` (wrapped on the instance) adds its
    wall seconds to ``totals[name]``; the methods are the class's own again on exit."""
    totals = dict.fromkeys(targets, 0.0)

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += time.perf_counter() - t
        return wrapper

    for name, (obj, attr) in targets.items():
        setattr(obj, attr, timed(name, getattr(obj, attr)))
    try:
        yield totals
    finally:
        for obj, attr in targets.values():
            delattr(obj, attr)  # back to the class's method


@contextmanager
def host_phases(llm: Any) -> Iterator[dict[str, float]]:
    """Host seconds spent inside the engine loop's parts while inside, summed: schedule, the
    runner's launch (stages 1-4 as the host sees them: prepare, graph replay, sampling launch),
    its finish (the wait for a step, then reading its tokens), stage 5's processing, and the
    scheduler's update. What the step's wall time holds beyond them is the loop itself."""
    core = llm.core
    with timed_calls({"schedule": (core.scheduler, "schedule"), "launch": (core.runner, "launch"),
                      "finish": (core.runner, "finish"), "process": (core, "_process"),
                      "update": (core.scheduler, "update_from_output")}) as totals:
        yield totals


def decode_breakdown(records: list[dict[str, Any]], batch: int) -> dict[str, float]:
    """Median ms per full-batch graph step: wall (host time between consecutive completions),
    GPU compute, aggregate and idle, host prepare and return."""
    full = [i for i, r in enumerate(records) if r["graph"] and r["batch"] == batch]
    if not full:
        return {}
    walls = [records[i]["t"] - records[i - 1]["t"] for i in full if i > 0 and i - 1 in full]
    out = {"steps": float(len(full)), "wall": 1e3 * median(walls) if walls else float("nan"),
           "gpu_idle": 1e3 * median(records[i]["idle"] for i in full)}
    for stage in ("compute", "aggregate", "prepare", "return"):
        out[stage] = 1e3 * median(records[i]["stages"].get(stage, 0.0) for i in full)
    return out


def profile_decode(llm: Any, prompts: list[list[int]], new_tokens: int, steps: int,
                   top: int = 12) -> list[tuple[str, float, float]]:
    """Run ``prompts`` to ``new_tokens``; once every request has its first token, profile
    ``steps`` engine steps. The ``top`` kernels by device time: (name, calls per step, us per step),
    then ("all kernels", launches per step, us per step)."""
    from tessel.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    core = llm.core
    for i, prompt in enumerate(prompts):
        core.add_request(f"profile-{i}", prompt, params)
    started: set[str] = set()
    while len(started) < len(prompts) and core.has_unfinished():
        started.update(o.request_id for o in core.step() if o.outputs and o.outputs[0].token_ids)
    cuda = torch.cuda.is_available()  # without it (a dry run of the logic) CPU op times instead
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            core.step()
        sync()
    while core.has_unfinished():
        core.step()
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            per[e.key][0] += e.count / steps
            per[e.key][1] += us / steps
    ranked = sorted(per.items(), key=lambda kv: -kv[1][1])
    rows = [(name[:60], calls, us) for name, (calls, us) in ranked[:top]]
    rows.append(("all kernels", sum(v[0] for v in per.values()), sum(v[1] for v in per.values())))
    return rows
