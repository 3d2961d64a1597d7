"""Continuous batching: one token-budget loop over running, then waiting, requests.

A request only has tokens computed (KV written) and tokens known (prompt + output).
Prefill, chunked prefill, prefix hits, decode and resume-after-preemption are all
"compute the next ``min(known - computed, budget)`` tokens".
"""

from __future__ import annotations

from collections import deque

from tessel.config.settings import SchedulerConfig
from tessel.engine.kv_cache.manager import KVCacheManager
from tessel.engine.request import Request, RequestStatus
from tessel.engine.scheduler.output import ScheduledRequest, SchedulerOutput
from tessel.engine.scheduler.stats import SchedulerStats


class Scheduler:
    """Decides, each step, which requests compute how many tokens in which blocks.

    Call ``schedule`` then ``update_from_output`` once per step, in that order; the
    caller decides when a request stops and says so with ``finish_request``.
    """

    def __init__(
        self, config: SchedulerConfig, kv_cache: KVCacheManager, max_model_len: int
    ) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()  # FCFS; preempted requests go to the front
        self.running: list[Request] = []  # oldest first: the newest is preempted first
        self._finished_ids: list[str] = []  # since the last schedule, for the runner
        self._num_preemptions = 0
        self._num_scheduled_tokens = 0

    # ---- requests in and out -------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a request, rejecting one that could never be scheduled."""
        rid, prompt_len = request.request_id, request.num_prompt_tokens
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        if prompt_len == 0:
            raise ValueError("prompt must contain at least one token")
        if prompt_len >= self.max_model_len:
            raise ValueError(
                f"prompt is {prompt_len} tokens, which leaves no room to generate within "
                f"the maximum model length of {self.max_model_len} tokens"
            )
        # A request recomputes prompt + output after preemption; it must fit on its own.
        max_len = prompt_len + request.max_tokens
        if self.kv_cache.num_blocks_for(max_len) > self.kv_cache.num_total_blocks:
            raise ValueError(
                f"prompt ({prompt_len}) + max_tokens ({request.max_tokens}) tokens need "
                f"{self.kv_cache.num_blocks_for(max_len)} KV blocks, but the cache has only "
                f"{self.kv_cache.num_total_blocks}"
            )
        if (
            not self.config.enable_chunked_prefill
            and max_len - 1 > self.config.max_num_batched_tokens
        ):
            raise ValueError(
                f"prompt ({prompt_len}) + max_tokens ({request.max_tokens}) exceeds "
                f"max_num_batched_tokens ({self.config.max_num_batched_tokens}) "
                "and chunked prefill is off"
            )
        request.status = RequestStatus.WAITING
        self.requests[rid] = request
        self.waiting.append(request)

    def finish_request(self, request_id: str, status: RequestStatus) -> None:
        """End a request at any moment (waiting, mid-prefill, decoding) and free its
        blocks. Idempotent: unknown or already finished ids are ignored."""
        if not status.finished:
            raise ValueError(f"{status} is not a finished status")
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self.kv_cache.free(request_id)
        request.status = status
        self._finished_ids.append(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ---- one step --------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Spend the step's token budget: running requests in order, then waiting ones FCFS."""
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new <= 0:  # nothing known to compute (no token sampled for it yet)
                index += 1
                continue
            if not self._make_room(request, num_new, preempted):
                break  # it preempted itself: everything after it is gone too
            scheduled.append(self._scheduled(request, num_new, request.num_computed_tokens))
            budget -= num_new
            index += 1
        if not preempted:  # admitting while evicting would only thrash
            budget = self._admit_waiting(budget, scheduled)
        finished, self._finished_ids = self._finished_ids, []
        num_batched = self.config.max_num_batched_tokens - budget
        self._num_scheduled_tokens = num_batched
        return SchedulerOutput(scheduled, num_batched, self.kv_cache.tables.array, preempted, finished)

    def update_from_output(self, output: SchedulerOutput, sampled: dict[str, int]) -> None:
        """Record a finished step: advance computed tokens, publish newly full blocks,
        and append the token sampled for each request whose step reached its end."""
        for item in output.scheduled:
            request = item.request
            if self.requests.get(item.request_id) is not request:
                continue  # finished (e.g. aborted) while the step ran
            request.num_computed_tokens = item.start + item.num_new_tokens
            self.kv_cache.cache_full_blocks(request)
            if item.samples and item.request_id in sampled:
                request.output_token_ids.append(sampled[item.request_id])

    @property
    def stats(self) -> SchedulerStats:
        kv = self.kv_cache
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_blocks_used=kv.num_total_blocks - kv.num_free_blocks,
            kv_blocks_total=kv.num_total_blocks,
            prefix_cache_queries=kv.prefix_stats.queries,
            prefix_cache_hits=kv.prefix_stats.hits,
            num_preemptions=self._num_preemptions,
            num_scheduled_tokens=self._num_scheduled_tokens,
        )

    # ---- helpers ---------------------------------------------------------------------

    def _make_room(self, request: Request, num_new: int, preempted: list[str]) -> bool:
        """Allocate for a running request, preempting the newest running ones until it
        fits. False if the request had to preempt itself."""
        while not self.kv_cache.allocate_slots(request, num_new):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        """Preempt by recompute: drop its KV; on resume it recomputes prompt + output."""
        self.kv_cache.free(request.request_id)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self._num_preemptions += 1
        self.waiting.appendleft(request)

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledRequest]) -> int:
        """Move waiting requests to running, FCFS, while budget, seats and blocks last.
        Siblings still waiting on their first child's prompt are skipped, not blocking."""
        admitted: list[Request] = []
        for request in self.waiting:
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if self._waits_for_sibling(request):
                continue
            cached_blocks, num_cached = self.kv_cache.get_computed_blocks(request)
            num_new = request.num_tokens - num_cached
            if num_new > budget and not self.config.enable_chunked_prefill:
                break
            num_new = min(num_new, budget)
            if not self.kv_cache.allocate_slots(request, num_new, cached_blocks):
                break  # FCFS: later requests don't jump a head that doesn't fit
            if request.status == RequestStatus.WAITING:
                request.num_cached_tokens = num_cached
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached
            self.running.append(request)
            admitted.append(request)
            scheduled.append(self._scheduled(request, num_new, num_cached))
            budget -= num_new
        for request in admitted:
            self.waiting.remove(request)
        return budget

    def _waits_for_sibling(self, request: Request) -> bool:
        """True while the sibling it shares a prompt with is alive and still prefilling,
        so its prompt blocks will be prefix-cache hits rather than computed twice."""
        if request.sibling_of is None or not self.kv_cache.takes_prefix_hits(request):
            return False
        sibling = self.requests.get(request.sibling_of)
        return sibling is not None and sibling.num_computed_tokens < sibling.num_prompt_tokens

    def _scheduled(self, request: Request, num_new: int, start: int) -> ScheduledRequest:
        return ScheduledRequest(request, num_new, start, *self.kv_cache.table_slot(request.request_id))
