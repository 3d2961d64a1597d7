"""Small builders for engine tests: requests, a scheduler on a fake cache size, and a
fake model that checks the KV the scheduler's block tables point at."""

from __future__ import annotations

import zlib
from typing import Any

from tessel.config.settings import SchedulerConfig
from tessel.engine.kv_cache.manager import KVCacheManager
from tessel.engine.request import Request, RequestStatus
from tessel.engine.sampling_params import SamplingParams
from tessel.engine.scheduler.output import SchedulerOutput
from tessel.engine.scheduler.scheduler import Scheduler


def make_request(
    request_id: str,
    prompt: int | list[int],
    max_tokens: int = 16,
    sibling_of: str | None = None,
    **params: Any,
) -> Request:
    """A request whose prompt is the given ids, or ``prompt`` ids unique to this id
    (so unrelated requests never share a prefix by accident)."""
    if isinstance(prompt, int):
        base = zlib.crc32(request_id.encode()) * 10_000
        prompt = [base + i for i in range(prompt)]
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        params=SamplingParams(max_tokens=max_tokens, **params),
        max_tokens=max_tokens,
        sibling_of=sibling_of,
    )


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    prefix_caching: bool = True,
    chunked_prefill: bool = True,
    max_model_len: int = 1024,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=chunked_prefill,
    )
    return Scheduler(config, KVCacheManager(num_blocks, block_size, prefix_caching), max_model_len)


def next_token(request: Request) -> int:
    """The fake model's deterministic choice: a function of the sequence so far only,
    so a preempted-and-recomputed request generates exactly what it would have."""
    return (request.all_token_ids[-1] * 7 + request.num_tokens) % 50_021


class FakeModel:
    """Stands in for the runner: "writes" each computed token id into the slot its block
    table names, checks every earlier position holds the right token (so a wrong prefix
    hit or a block reused while live is caught), samples, and stops at max_tokens."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.block_size = scheduler.kv_cache.block_size
        self.slots: dict[int, list[int | None]] = {}

    def step(self) -> SchedulerOutput:
        was_running = {r.request_id for r in self.scheduler.running}
        out = self.scheduler.schedule()
        if out.preempted:  # a step that evicts admits nobody (it would only thrash)
            assert {s.request_id for s in out.scheduled} <= was_running
        assert out.num_batched_tokens == sum(s.num_new_tokens for s in out.scheduled)
        assert out.num_batched_tokens <= self.scheduler.config.max_num_batched_tokens
        assert len(out.scheduled) <= self.scheduler.config.max_num_seqs
        sampled: dict[str, int] = {}
        for item in out.scheduled:
            request, bs = item.request, self.block_size
            table = out.block_tables[item.table_row, : item.num_blocks].tolist()
            # The array mirror stage 1 gathers from holds exactly the manager's list, 0 after it.
            assert table == self.scheduler.kv_cache.block_table(item.request_id)
            assert not out.block_tables[item.table_row, item.num_blocks :].any()
            assert (
                item.num_new_tokens > 0 and item.start + item.num_new_tokens <= request.num_tokens
            )
            assert len(table) >= -(-(item.start + item.num_new_tokens) // bs)
            assert 0 not in table and len(set(table)) == len(table)
            for pos in range(item.start):
                assert self._slot(table, pos) == request.token_id_at(pos), (request.request_id, pos)
            for pos in range(item.start, item.start + item.num_new_tokens):
                self.slots.setdefault(table[pos // bs], [None] * bs)[pos % bs] = (
                    request.token_id_at(pos)
                )
            if item.samples:
                sampled[item.request_id] = next_token(request)
        self.scheduler.update_from_output(out, sampled)
        for item in out.scheduled:
            request = item.request
            if not request.is_finished and request.num_output_tokens >= request.max_tokens:
                self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_LENGTH)
        return out

    def run(self, max_steps: int = 10_000) -> int:
        """Step until nothing is left; returns the number of steps taken."""
        steps = 0
        while self.scheduler.has_unfinished():
            self.step()
            steps += 1
            assert steps <= max_steps, "requests starved"
        return steps

    def _slot(self, table: list[int], pos: int) -> int | None:
        return self.slots.get(table[pos // self.block_size], [None] * self.block_size)[
            pos % self.block_size
        ]


def expected_output(request: Request) -> list[int]:
    """What the fake model generates for this prompt, computed without any scheduler."""
    shadow = Request(
        request.request_id, list(request.prompt_token_ids), request.params, request.max_tokens
    )
    for _ in range(request.max_tokens):
        shadow.output_token_ids.append(next_token(shadow))
    return shadow.output_token_ids


def assert_block_invariants(scheduler: Scheduler) -> None:
    """Ref counts equal the number of requests holding each block; waiting requests hold
    none; free blocks are unheld; every running request holds room for its computed tokens."""
    kv, pool = scheduler.kv_cache, scheduler.kv_cache.pool
    holders: dict[int, int] = {}
    for request in scheduler.running:
        table = kv.block_table(request.request_id)
        assert len(table) == len(set(table))
        assert len(table) * kv.block_size >= request.num_computed_tokens
        for block in table:
            holders[block] = holders.get(block, 0) + 1
    for request in scheduler.waiting:
        assert kv.block_table(request.request_id) == []
    for block in range(1, pool.num_blocks):
        assert pool.ref_count(block) == holders.get(block, 0), block
    assert pool.num_free == pool.num_usable - len(holders)


def assert_all_free(scheduler: Scheduler) -> None:
    kv = scheduler.kv_cache
    assert kv.num_free_blocks == kv.num_total_blocks
    assert kv.usage == 0.0
