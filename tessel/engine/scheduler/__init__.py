"""Continuous batching over the paged KV cache: what runs each step, with how many tokens."""

from tessel.engine.scheduler.output import ScheduledRequest, SchedulerOutput
from tessel.engine.scheduler.scheduler import Scheduler
from tessel.engine.scheduler.stats import SchedulerStats

__all__ = ["ScheduledRequest", "Scheduler", "SchedulerOutput", "SchedulerStats"]
