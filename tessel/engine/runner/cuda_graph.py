"""CUDA graphs of the decode forward pass at a set of batch sizes.

A decode step of ``b`` requests is padded to the smallest captured size ``>= b`` (padded rows:
seq_len 1, slot -1, so they write nothing and read one cached token) and replayed; the graph
reads its inputs from static tensors that the step's device buffers are copied into, and the
attention plan from ``StaticDecodePlan``'s buffers, whose layout depends only on the size.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left

import numpy as np
import torch
from torch import nn

from tessel.engine.runner.step_inputs import PreparedStep
from tessel.kernels.attention.decode_plan import ENGINE_PLAN, StaticDecodePlan
from tessel.kernels.attention.metadata import AttentionMetadata

log = logging.getLogger("tessel.engine")


def default_graph_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to min(max_num_seqs, 256) (as vLLM and nano-vllm do)."""
    cap = min(max_num_seqs, 256)
    sizes = [s for s in (1, 2, 4) if s <= cap] + list(range(8, cap + 1, 8))
    return sizes or [1]


class DecodeGraphs:
    """Captures ``model``'s decode forward at ``sizes`` and replays the right one per step."""

    def __init__(
        self,
        model: nn.Module,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        sizes: list[int],
        max_blocks: int,
        block_size: int,
        static_plan: StaticDecodePlan,
    ) -> None:
        self.model, self.kv_caches = model, kv_caches
        self.sizes = sorted(set(sizes))
        self.block_size, self.static_plan = block_size, static_plan
        device = kv_caches[0][0].device
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def size_for(self, batch: int) -> int | None:
        """The captured size a decode batch is padded to; None above the largest."""
        i = bisect_left(self.sizes, batch)
        return self.sizes[i] if i < len(self.sizes) else None

    def _metadata(self, b: int, context: int = 1) -> AttentionMetadata:
        md = AttentionMetadata(
            slot_mapping=self.slot_mapping[:b],
            query_start_loc=self.query_start_loc[: b + 1],
            seq_lens=self.seq_lens[:b],
            block_tables=self.block_tables[:b],
            max_query_len=1,
            max_seq_len=context,
            block_size=self.block_size,
            seq_lens_cpu=torch.full((b,), context, dtype=torch.int32),
        )
        host = np.zeros(self.static_plan.size, dtype=np.int32)
        plan = self.static_plan.plan(np.full(b, context, dtype=np.int32), host)
        self.static_plan.sched.copy_(torch.from_numpy(host))
        md.scratch[ENGINE_PLAN] = plan
        md.scratch["block_tables_i32"] = md.block_tables
        return md

    @torch.inference_mode()
    def tune(self, context: int = 1024) -> None:
        """Run the largest size once over ``context`` cached tokens per request, so kernels that
        autotune on their first call (decode attention) time real work, not the length-1
        contexts the graphs are captured with. Nothing is written (slots are -1); the blocks
        read are any of the cache's, stale or not."""
        b = self.sizes[-1]
        num_blocks = self.kv_caches[0][0].shape[0]
        # max_blocks - 2 whole blocks stay below max_model_len, so every position has a RoPE row
        context = max(1, min(context, (self.block_tables.shape[1] - 2) * self.block_size))
        width = -(-context // self.block_size)
        self.seq_lens[:b].fill_(context)
        self.positions[:b].fill_(context - 1)
        self.block_tables[:b, :width].copy_(
            torch.arange(b * width, device=self.block_tables.device).view(b, width) % num_blocks
        )
        md = self._metadata(b, context)
        self.model(self.input_ids[:b], self.positions[:b], self.kv_caches, md)
        torch.cuda.synchronize()
        self.seq_lens.fill_(1)
        self.positions.zero_()
        self.block_tables.zero_()

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first so smaller graphs reuse its memory pool."""
        start = time.perf_counter()
        self.tune()
        pool = None
        for b in reversed(self.sizes):
            md = self._metadata(b)
            args = (self.input_ids[:b], self.positions[:b], self.kv_caches, md)
            self.model(*args)  # warm-up: Triton autotuning and compilation stay out of the graph
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self.model(*args)
            pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()
        log.info("captured %d decode graphs (%s) in %.1f s", len(self.sizes), self.sizes, time.perf_counter() - start)

    def run(self, step: PreparedStep, input_ids: torch.Tensor) -> torch.Tensor:
        """Copy the step's device inputs into the static ones and replay; [graph_batch, hidden]."""
        b = step.graph_batch
        assert b is not None and step.plan is not None
        buf = step.buffers
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(buf.device_view("positions"))
        self.slot_mapping[:b].copy_(buf.device_view("slot_mapping"))
        self.seq_lens[:b].copy_(buf.device_view("seq_lens"))
        w = step.block_width
        self.block_tables[:b, :w].copy_(buf.device_view("block_tables").view(b, w))
        self.static_plan.sched.copy_(buf.device_view("decode_plan"))
        self.graphs[b].replay()
        return self.outputs[b]
