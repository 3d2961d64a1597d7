"""Continuous batching over the paged KV cache: what runs each step, with how many tokens."""

from engine.scheduler.output import ScheduledRequest, SchedulerOutput
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.stats import SchedulerStats

__all__ = ["ScheduledRequest", "Scheduler", "SchedulerOutput", "SchedulerStats"]
