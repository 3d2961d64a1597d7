"""The runner's side of an engine step, in named stages (stage 5 is ``EngineCore``'s):

1. prepare   (host)   scheduler output -> positions, slots, block tables, decode plan, in pinned buffers
2. copy      (stream) those buffers -> device, non-blocking, on a copy stream
3. compute   (GPU)    fill inputs from the previous step's sampled ids; the forward (graph or eager)
4. aggregate (GPU)    logits, sampling; sampled ids copied back non-blocking into pinned memory
5. return    (host)   ``finish``: wait for the ids, then detokenize, stop checks, deltas (core)

``launch`` runs 1-4 and returns at once with an ``InFlightStep``; ``finish`` waits for it. Two
buffer sets alternate, so ``launch`` of step N+1 may run while step N still computes.

Under tensor parallelism rank 0 ``launch``es as above and broadcasts stage 1's buffers and the
sampled ids (``StepChannel``); each worker ``follow``s with stages 2-4 of the same step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from tessel.config.model_arch import ModelArch
from tessel.engine.models.layers.parallel import SINGLE, ParallelRank
from tessel.engine.request import Logprob, Request
from tessel.engine.runner.buffers import DoubleBuffer, input_specs
from tessel.engine.runner.cuda_graph import DecodeGraphs
from tessel.engine.runner.expert_load import ExpertLoadReader
from tessel.engine.runner.step_inputs import PreparedStep, prepare_step
from tessel.engine.sampler import Sampler
from tessel.engine.sampling_metadata import SamplingMetadata
from tessel.engine.scheduler.output import SchedulerOutput
from tessel.kernels.attention.decode_plan import (
    DEFAULT_DECODE,
    ENGINE_PLAN,
    DecodeConfig,
    StaticDecodePlan,
)
from tessel.kernels.attention.metadata import AttentionMetadata

if TYPE_CHECKING:
    from tessel.engine.distributed.step_channel import StepChannel

STAGES = ("prepare", "copy", "compute", "aggregate", "return")


@dataclass
class RunnerOutput:
    """What a step produced, on the host, keyed by request id."""

    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, Logprob] = field(default_factory=dict)
    # request id -> (prompt index of the first scored token, logprobs from there on)
    prompt_logprobs: dict[str, tuple[int, list[Logprob]]] = field(default_factory=dict)
    # [MoE layer][expert] tokens routed this step (padded CUDA-graph rows included); None if dense
    expert_load: list[list[int]] | None = None


@dataclass
class StepTiming:
    """Seconds per stage of one step: host wall time for 1 and 5, device time for 2-4 on CUDA."""

    stages: dict[str, float] = field(default_factory=dict)
    gpu_idle_before: float = 0.0  # device idle between the previous step's end and this one's compute
    plan_imbalance: float | None = None  # decode plan: max bucket load / mean - 1
    graph: bool = False  # replayed a CUDA graph


@dataclass
class InFlightStep:
    """A launched step: its device results and the events that say when they are ready."""

    sched: SchedulerOutput
    step: PreparedStep
    rows: dict[str, int]  # request id -> row of ``sampled``
    sampled: torch.Tensor | None  # [S] int64 on the device (next step's inputs read it there)
    sampled_host: torch.Tensor | None  # [S] pinned copy, valid once ``done`` has fired
    raw_logprobs: torch.Tensor | None
    meta: SamplingMetadata | None
    prompt_logprobs: dict[str, tuple[int, list[Logprob]]]
    timing: StepTiming
    events: dict[str, torch.cuda.Event] = field(default_factory=dict)
    # overlap: request id -> (request, index in its output_token_ids of this step's placeholder)
    placeholder_at: dict[str, tuple[Request, int]] = field(default_factory=dict)
    expert_load: torch.Tensor | None = None  # [MoE layers, experts] host copy, valid once ``done``


class StepPipeline:
    """Stages 1-4 over double-buffered inputs; CUDA graphs for decode when given sizes."""

    def __init__(
        self,
        model: nn.Module,
        arch: ModelArch,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        sampler: Sampler,
        block_size: int,
        *,
        max_tokens: int,
        max_seqs: int,
        max_model_len: int,
        decode_config: DecodeConfig = DEFAULT_DECODE,
        graph_sizes: list[int] | None = None,
        tp: ParallelRank = SINGLE,
        channel: StepChannel | None = None,
    ) -> None:
        self.model, self.arch, self.kv_caches, self.sampler = model, arch, kv_caches, sampler
        self.block_size = block_size
        self.channel = channel  # None at one rank: nothing is broadcast
        self.device = kv_caches[0][0].device
        self.cuda = self.device.type == "cuda"
        max_blocks = -(-max_model_len // block_size) + 1
        q_heads = tp.shard(arch.num_attention_heads, "num_attention_heads")
        kv_heads, d = tp.kv_heads(arch.num_key_value_heads)[0], arch.head_dim
        self.static_plan = (
            StaticDecodePlan(max_seqs, q_heads, kv_heads, d, self.device, decode_config, max_model_len)
            if self.cuda
            else None
        )
        plan_size = self.static_plan.size if self.static_plan else 0
        self.buffers = DoubleBuffer(input_specs(max_tokens, max_seqs, max_blocks, plan_size), self.device)
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.graphs: DecodeGraphs | None = None
        if self.cuda and graph_sizes and self.static_plan is not None:
            sizes = [s for s in graph_sizes if s <= max_seqs]
            self.graphs = DecodeGraphs(
                model, kv_caches, sizes, max_blocks, block_size, self.static_plan
            )
        self._last_end: torch.cuda.Event | None = None
        self._sampled_host = [
            torch.zeros(max_seqs, dtype=torch.long, pin_memory=self.cuda) for _ in range(2)
        ]
        self.expert_load = ExpertLoadReader(model, self.device)

    def capture_graphs(self) -> None:
        if self.graphs is not None:
            self.graphs.capture()
            self.expert_load.reset()  # capture ran the forward: its routing is no step's

    @torch.inference_mode()
    def warm_up_sampling(self, dtype: torch.dtype) -> None:
        """Run the LM head and both fused sampling variants once (every rank: the head may
        gather across them)."""
        if not self.cuda:
            return
        hidden = torch.zeros(1, self.arch.hidden_size, dtype=dtype, device=self.device)
        logits = self.model.compute_logits(hidden)  # type: ignore[operator]
        if logits is not None:
            self.sampler.warm_up(logits)

    # ---- stages 1-4 ------------------------------------------------------------------

    @torch.inference_mode()
    def launch(self, sched: SchedulerOutput, prev: InFlightStep | None) -> InFlightStep:
        """Stages 1-4 of ``sched``; placeholder tokens are read from ``prev.sampled`` on the device."""
        timing = StepTiming()
        t0 = time.perf_counter()
        buf = self.buffers.acquire()
        decode_only = all(s.num_new_tokens == 1 for s in sched.scheduled)
        graph_batch = self.graphs.size_for(len(sched.scheduled)) if self.graphs and decode_only else None
        prev_rows = prev.rows if prev is not None else {}
        step = prepare_step(
            sched.scheduled, sched.block_tables, buf, self.block_size, prev_rows, graph_batch, self.static_plan
        )
        if self.channel is not None:
            self.channel.send(step)
        if step.plan is not None:
            timing.plan_imbalance = step.plan.host.imbalance()
        t1 = time.perf_counter()
        timing.stages["prepare"] = t1 - t0
        ev: dict[str, torch.cuda.Event] = {}
        self._record(ev, "copy_start", self.copy_stream)
        buf.upload(self.copy_stream)  # stage 2
        self._record(ev, "copy_end", self.copy_stream)
        compute = torch.cuda.current_stream(self.device) if self.cuda else None
        if compute is not None and buf.uploaded is not None:
            compute.wait_event(buf.uploaded)
        self._record(ev, "compute_start", compute)
        t2 = time.perf_counter()
        hidden = self._forward(step, prev.sampled if prev is not None else None)  # stage 3
        self._record(ev, "compute_end", compute)
        t3 = time.perf_counter()
        inflight = self._aggregate(sched, step, hidden, timing, ev)  # stage 4
        inflight.expert_load = self.expert_load.snapshot(buf.index)  # before "end": finish waits for it
        if compute is None:  # the CPU runs each stage as it is called: host clocks are the times
            timing.stages.update(copy=t2 - t1, compute=t3 - t2, aggregate=time.perf_counter() - t3)
        if compute is not None:
            buf.consumed = torch.cuda.Event()
            buf.consumed.record(compute)
        self._record(ev, "end", compute)
        timing.graph = graph_batch is not None
        return inflight

    @torch.inference_mode()
    def follow(self, step: PreparedStep, prev_sampled: torch.Tensor | None) -> torch.Tensor | None:
        """A worker's stages 2-4 of a step rank 0 prepared: the same forward, this rank's logits
        sent to rank 0, and the ids rank 0 sampled received (the next step's inputs read them)."""
        assert self.channel is not None
        buf = step.buffers
        buf.upload(self.copy_stream)
        compute = torch.cuda.current_stream(self.device) if self.cuda else None
        if compute is not None and buf.uploaded is not None:
            compute.wait_event(buf.uploaded)
        hidden = self._forward(step, prev_sampled)
        for chunk in step.prompt_logprobs:
            self.model.compute_logits(hidden[chunk.rows])  # type: ignore[operator]  # joins rank 0's gather
        sampled = None
        num_sampling = buf.used("logits_indices")
        if num_sampling:
            self.model.compute_logits(hidden.index_select(0, buf.device_view("logits_indices")))  # type: ignore[operator]
            sampled = self.channel.receive_sampled(num_sampling, self.device)
        self.expert_load.reset()  # rank 0 routed the same tokens the same way and reports them
        if compute is not None:
            buf.consumed = torch.cuda.Event()
            buf.consumed.record(compute)
        return sampled

    def _forward(self, step: PreparedStep, prev_sampled: torch.Tensor | None) -> torch.Tensor:
        buf = step.buffers
        input_ids = buf.device_view("input_ids")
        if step.num_from_prev:
            assert prev_sampled is not None
            src, dst = buf.device_view("prev_src"), buf.device_view("prev_dst")
            input_ids.index_copy_(0, dst, prev_sampled.index_select(0, src))
        if step.graph_batch is not None and self.graphs is not None:
            return self.graphs.run(step, input_ids)
        md = self._metadata(step)
        return self.model(input_ids, buf.device_view("positions"), self.kv_caches, md)

    def _metadata(self, step: PreparedStep) -> AttentionMetadata:
        buf = step.buffers
        md = AttentionMetadata(
            slot_mapping=buf.device_view("slot_mapping"),
            query_start_loc=buf.device_view("query_start_loc"),
            seq_lens=buf.device_view("seq_lens"),
            block_tables=buf.device_view("block_tables").view(step.batch, step.block_width),
            max_query_len=step.max_query_len,
            max_seq_len=step.max_seq_len,
            block_size=self.block_size,
            seq_lens_cpu=torch.from_numpy(step.seq_lens),
        )
        if step.plan is not None:  # eager decode: the kernels read the plan where stage 2 put it
            plan = step.plan
            plan.sched = buf.device_view("decode_plan")
            md.scratch[ENGINE_PLAN] = plan
        return md

    def _aggregate(
        self, sched: SchedulerOutput, step: PreparedStep, hidden: torch.Tensor, timing: StepTiming,
        ev: dict[str, torch.cuda.Event],
    ) -> InFlightStep:
        prompt_lp = {}
        if step.prompt_logprobs:  # echo scoring is rare: done synchronously
            from tessel.engine.runner.model_runner import score_tokens

            for chunk in step.prompt_logprobs:
                logits = self.model.compute_logits(hidden[chunk.rows]).float()  # type: ignore[operator]
                prompt_lp[chunk.request_id] = (chunk.first_target, score_tokens(logits, chunk.targets, chunk.num_top))
        requests = [s.request for s in step.sampling]
        rows = {r.request_id: i for i, r in enumerate(requests)}
        if not requests:
            return InFlightStep(sched, step, rows, None, None, None, None, prompt_lp, timing, ev)
        indices = step.buffers.device_view("logits_indices")
        logits = self.model.compute_logits(hidden.index_select(0, indices))  # type: ignore[operator]
        meta = SamplingMetadata.build(requests, self.arch.vocab_size, self.device)
        tokens, raw_lp = self.sampler.sample_on_device(logits, meta)
        if self.channel is not None:
            self.channel.send_sampled(tokens)
        host = self._sampled_host[step.buffers.index][: len(requests)]
        host.copy_(tokens, non_blocking=True)
        return InFlightStep(sched, step, rows, tokens, host, raw_lp, meta, prompt_lp, timing, ev)

    # ---- stage 5's wait ----------------------------------------------------------------

    def finish(self, inflight: InFlightStep) -> RunnerOutput:
        """Wait for a launched step and read its results on the host."""
        if "end" in inflight.events:
            inflight.events["end"].synchronize()
            self._device_times(inflight)
        load = inflight.expert_load
        out = RunnerOutput(prompt_logprobs=inflight.prompt_logprobs, expert_load=None if load is None else load.tolist())
        if inflight.sampled is None:
            return out
        requests = [s.request for s in inflight.step.sampling]
        if inflight.meta is not None and inflight.meta.max_num_logprobs is not None:
            result = Sampler.to_host(inflight.sampled, inflight.raw_logprobs, inflight.meta)
            token_ids, logprobs = result.token_ids, result.logprobs
        else:
            assert inflight.sampled_host is not None
            token_ids, logprobs = inflight.sampled_host.tolist(), None
        for i, request in enumerate(requests):
            out.sampled[request.request_id] = token_ids[i]
            if logprobs is not None and (lp := logprobs[i]) is not None:
                out.logprobs[request.request_id] = lp
        return out

    # ---- timing ------------------------------------------------------------------------

    def _record(self, ev: dict[str, torch.cuda.Event], name: str, stream: torch.cuda.Stream | None) -> None:
        if stream is None:
            return
        e = torch.cuda.Event(enable_timing=True)
        e.record(stream)
        ev[name] = e

    def _device_times(self, inflight: InFlightStep) -> None:
        ev, t = inflight.events, inflight.timing
        t.stages["copy"] = ev["copy_start"].elapsed_time(ev["copy_end"]) / 1e3
        t.stages["compute"] = ev["compute_start"].elapsed_time(ev["compute_end"]) / 1e3
        t.stages["aggregate"] = ev["compute_end"].elapsed_time(ev["end"]) / 1e3
        if self._last_end is not None:
            t.gpu_idle_before = max(self._last_end.elapsed_time(ev["compute_start"]) / 1e3, 0.0)
        self._last_end = ev["end"]
