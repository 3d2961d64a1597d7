"""One engine step: schedule -> run the model -> update requests -> hand back deltas."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from tessel.engine.distributed.group import TensorParallelError
from tessel.engine.engine_setup import EngineParts
from tessel.engine.faults import StepFaults
from tessel.engine.gc_freeze import freeze_startup_heap
from tessel.engine.request import (
    CompletionOutput,
    Logprob,
    Request,
    RequestMetrics,
    RequestOutput,
    RequestStatus,
)
from tessel.engine.runner.pipeline import InFlightStep, RunnerOutput
from tessel.engine.runner.step_inputs import PLACEHOLDER
from tessel.engine.sampling_params import SamplingParams
from tessel.engine.scheduler.output import SchedulerOutput
from tessel.engine.stats import EngineStats, ExpertLoadStats, PipelineStats


@dataclass
class _Parent:
    """A user request: its n child sequences and what the caller still has to be told."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]
    metrics: RequestMetrics
    prompt_logprobs: list[Logprob | None] | None
    prompt_logprobs_sent: bool = False

    @property
    def finished(self) -> bool:
        return all(c.is_finished for c in self.children)


class EngineCore:
    """Synchronous engine: ``add_request`` any time between steps, ``step`` in a loop."""

    def __init__(self, parts: EngineParts) -> None:
        self.parts = parts
        self.tokenizer = parts.tokenizer
        self.scheduler = parts.scheduler
        self.runner = parts.runner
        self.outputs = parts.output_processor
        self.max_model_len = parts.max_model_len
        self._parents: dict[str, _Parent] = {}
        self._child_parent: dict[str, _Parent] = {}  # child request id -> its user request
        self._penalized: set[str] = set()  # unfinished child ids whose sampling uses penalties
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._finished_total: dict[str, int] = {}
        self.overlap = parts.overlap_scheduling
        self._inflight: InFlightStep | None = None  # launched, results not yet read (overlap)
        self.step_stats = PipelineStats()
        num_experts = parts.arch.num_experts
        self.expert_stats = ExpertLoadStats(num_experts) if num_experts else None  # None: dense
        self.faults = StepFaults()  # test-only: injected step failures
        self.parallel = parts.parallel  # None at one rank
        freeze_startup_heap()

    # ---- failures ----------------------------------------------------------------------

    def drop_inflight(self) -> None:
        """After a failed step: forget the step in flight (its requests are aborted), so the
        next step does not wait on it again."""
        self._inflight = None

    # ---- requests in -----------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request (n > 1 becomes n sequences sharing the prompt's KV blocks).
        Raises ValueError, naming the numbers, for prompts that cannot be served."""
        if request_id in self._parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_prompt(token_ids, params)
        room = self.max_model_len - len(token_ids)
        max_tokens = room if params.max_tokens is None else params.max_tokens
        if max_tokens > room:
            raise ValueError(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt "
                f"has {len(token_ids)} tokens and max_tokens is {max_tokens}, "
                f"{len(token_ids) + max_tokens} in all"
            )
        arrival = time.monotonic() if arrival_time is None else arrival_time
        children = [
            self._child(request_id, i, token_ids, params, max_tokens, arrival) for i in range(params.n)
        ]
        added: list[Request] = []  # all or nothing: a rejected child leaves no sibling queued
        try:
            for child in children:
                self.scheduler.add_request(child)
                added.append(child)
        except ValueError:
            for child in added:
                self.scheduler.finish_request(child.request_id, RequestStatus.FINISHED_ABORTED)
            raise
        parent = _Parent(
            request_id, text, token_ids, children, RequestMetrics(arrival),
            [None] if params.prompt_logprobs is not None else None,
        )
        for index, child in enumerate(children):
            self.outputs.add_request(child, index)
            self._child_parent[child.request_id] = parent
            if _uses_penalties(child.params):
                self._penalized.add(child.request_id)
        self._parents[request_id] = parent
        self._prompt_tokens_total += len(token_ids)

    def _child(
        self, rid: str, index: int, prompt: list[int], params: SamplingParams, max_tokens: int, arrival: float
    ) -> Request:
        child_params = params
        if params.n > 1 and params.seed is not None:
            child_params = replace(params, seed=params.seed + index)  # distinct but reproducible
        eos = self.parts.eos_token_id
        extra_eos = [t for t in self.parts.arch.eos_token_ids if t != eos and t not in params.stop_token_ids]
        if extra_eos and not params.ignore_eos:  # e.g. Llama 3's <|eot_id|> beside <|end_of_text|>
            child_params = replace(child_params, stop_token_ids=[*params.stop_token_ids, *extra_eos])
        return Request(
            request_id=rid if params.n == 1 else f"{rid}#{index}",
            prompt_token_ids=prompt,
            params=child_params,
            max_tokens=max_tokens,
            eos_token_id=eos,
            arrival_time=arrival,
            sibling_of=None if index == 0 or params.n == 1 else f"{rid}#0",
        )

    def _check_prompt(self, token_ids: list[int], params: SamplingParams) -> None:
        vocab = self.parts.vocab_size
        if not token_ids:
            raise ValueError("the prompt is empty")
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"this model's maximum context length is {self.max_model_len} tokens; "
                f"the prompt has {len(token_ids)} tokens"
            )
        if params.logit_bias:
            bad = next((t for t in params.logit_bias if not 0 <= int(t) < vocab), None)
            if bad is not None:
                raise ValueError(f"logit_bias token id {bad} is outside the vocabulary [0, {vocab})")

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """End a request at any moment (waiting, mid-prefill, decoding); frees its blocks."""
        parent = self._parents.pop(request_id, None)
        if parent is None:
            return
        for child in parent.children:
            if not child.is_finished:
                self._count_finish(reason)
            self._release(child, RequestStatus(reason))

    def unfinished_request_ids(self) -> list[str]:
        return list(self._parents)

    # ---- one step --------------------------------------------------------------------

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    def step(self) -> list[RequestOutput]:
        """One engine step. With overlap, step N+1 is scheduled and launched before step N's
        results are read (stage 5 of N runs while N+1 computes); otherwise one at a time.

        Under tensor parallelism any error is fatal (``TensorParallelError``): the workers may be
        waiting in a collective this rank never reached, so the ranks are out of step."""
        if self.parallel is None:
            return self._step()
        if self.parallel.failure is not None:
            raise self.parallel.failure
        try:
            return self._step()
        except Exception as exc:
            error = TensorParallelError(f"tensor-parallel step failed: {exc}")
            self.parallel.fail(error)
            raise error from exc

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent)."""
        if self.parallel is not None:
            self.parallel.shutdown()

    def _step(self) -> list[RequestOutput]:
        if not self.overlap:
            sched = self.scheduler.schedule()
            if sched.is_empty:
                return []
            self.faults.strike()
            inflight = self.runner.launch(sched)
            return self._complete(inflight, placeholders=False)
        outputs: list[RequestOutput] = []
        prev = self._inflight
        if prev is not None and self._needs_history():
            outputs, prev, self._inflight = self._complete(prev, placeholders=True), None, None
        sched = self.scheduler.schedule()
        if not sched.is_empty:
            self.faults.strike()
        cur = None if sched.is_empty else self.runner.launch(sched, prev)
        if prev is not None:
            outputs += self._complete(prev, placeholders=True)
        if cur is not None:  # the step's tokens are known only as placeholders until completed
            for s in cur.step.sampling:
                cur.placeholder_at[s.request_id] = (s.request, s.request.num_output_tokens)
            self.scheduler.update_from_output(sched, dict.fromkeys(cur.rows, PLACEHOLDER))
        self._inflight = cur
        return outputs

    def _needs_history(self) -> bool:
        """Whether a running request's sampling reads its output tokens' values (penalties):
        then the step in flight is completed before the next is scheduled."""
        if not self._penalized:  # the common case, without a scan of the running requests
            return False
        return any(_uses_penalties(r.params) for r in self.scheduler.running)

    def _complete(self, inflight: InFlightStep, placeholders: bool) -> list[RequestOutput]:
        """Stage 5: wait for a launched step, fill its tokens in, detokenize, check stops."""
        result = self.runner.finish(inflight)
        t0 = time.perf_counter()
        if self.expert_stats is not None and result.expert_load is not None:
            self.expert_stats.record(result.expert_load)
        sched = inflight.sched
        if placeholders:
            for rid, (request, index) in inflight.placeholder_at.items():
                if index < len(request.output_token_ids) and rid in result.sampled:
                    request.output_token_ids[index] = result.sampled[rid]
        else:
            self.scheduler.update_from_output(sched, result.sampled)
        outputs = self._process(sched, result)
        timing = inflight.timing
        timing.stages["return"] = time.perf_counter() - t0
        self.step_stats.record(timing, len(sched.scheduled))
        return outputs

    def _process(self, sched: SchedulerOutput, result: RunnerOutput) -> list[RequestOutput]:
        now = time.monotonic()
        deltas: dict[str, list[CompletionOutput]] = {}
        # Per request per step at full batch: lookups hoisted, the common case kept short.
        child_parent, sampled, logprobs = self._child_parent, result.sampled, result.logprobs
        process = self.outputs.process
        num_generated = 0
        for s in sched.scheduled:
            request = s.request
            parent = child_parent.get(s.request_id)
            if parent is None or request.is_finished:
                self.step_stats.wasted_tokens_total += s.num_new_tokens
                continue
            metrics = parent.metrics
            if metrics.scheduled_time is None:
                metrics.scheduled_time = now
            if parent.prompt_logprobs is not None:
                self._add_prompt_logprobs(parent, request, result)
            token = sampled.get(s.request_id)
            if token is None:
                continue
            if request.max_tokens == 0:  # prompt only (echo, scoring): the sample is dropped
                request.output_token_ids.clear()
                delta = CompletionOutput(parent.children.index(request), "", [], "length")
            else:
                logprob = logprobs.get(s.request_id) if logprobs else None
                delta = process(request, None if logprob is None else [logprob])
                num_generated += len(delta.token_ids)
            if delta.finish_reason is not None:
                self._release(request, RequestStatus(delta.finish_reason))
                self._count_finish(delta.finish_reason)
            deltas.setdefault(parent.request_id, []).append(delta)
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.token_times.append(now)
        self._generation_tokens_total += num_generated
        return [self._emit(self._parents[pid], outs, now) for pid, outs in deltas.items()]

    @staticmethod
    def _add_prompt_logprobs(parent: _Parent, request: Request, result: RunnerOutput) -> None:
        scored = result.prompt_logprobs.get(request.request_id)
        if parent.prompt_logprobs is not None and scored and request is parent.children[0]:
            first, logprobs = scored
            if first == len(parent.prompt_logprobs):  # a recompute after preemption adds nothing
                parent.prompt_logprobs.extend(logprobs)

    def _emit(self, parent: _Parent, outs: list[CompletionOutput], now: float) -> RequestOutput:
        # A parent finishes in the step where its last child does, so only then is it checked.
        finished = any(o.finish_reason is not None for o in outs) and parent.finished
        if finished:
            parent.metrics.finished_time = now
            del self._parents[parent.request_id]
        prompt_logprobs = None
        if parent.prompt_logprobs is not None and not parent.prompt_logprobs_sent:
            prompt_logprobs, parent.prompt_logprobs_sent = parent.prompt_logprobs, True
        return RequestOutput(
            request_id=parent.request_id,
            prompt_token_ids=parent.prompt_token_ids,
            outputs=outs,
            finished=finished,
            prompt=parent.prompt,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=parent.children[0].num_cached_tokens,
            metrics=parent.metrics,
        )

    def _release(self, request: Request, status: RequestStatus) -> None:
        self.scheduler.finish_request(request.request_id, status)
        self.runner.forget(request.request_id)
        self.outputs.abort(request.request_id)
        self._child_parent.pop(request.request_id, None)
        self._penalized.discard(request.request_id)

    def _count_finish(self, reason: str) -> None:
        self._finished_total[reason] = self._finished_total.get(reason, 0) + 1

    def stats(self) -> EngineStats:
        s = self.scheduler.stats
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_blocks_used=s.kv_blocks_used,
            kv_blocks_total=s.kv_blocks_total,
            kv_usage=s.kv_usage,
            prefix_cache_queries_total=s.prefix_cache_queries,
            prefix_cache_hits_total=s.prefix_cache_hits,
            preemptions_total=s.num_preemptions,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            num_scheduled_tokens=s.num_scheduled_tokens,
            requests_finished_total=dict(self._finished_total),
            tensor_parallel_size=self.parts.tensor_parallel_size,
            kv_cache_bytes=self.parts.kv_cache_bytes,
            **self.step_stats.snapshot(),
            **(self.expert_stats.snapshot() if self.expert_stats is not None else {}),
        )


def _uses_penalties(params: SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
    )
