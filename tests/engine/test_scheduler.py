"""The scheduler driven step by step by a fake model (no tensors): batching, budget,
chunked prefill, prefix sharing, siblings, preemption and aborts."""

from __future__ import annotations

import pytest

from tessel.engine.request import RequestStatus
from tessel.engine.scheduler.output import SchedulerOutput
from tests.factories import (
    FakeModel,
    assert_all_free,
    assert_block_invariants,
    expected_output,
    make_request,
    make_scheduler,
)


def _ids(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(s.request_id, s.num_new_tokens) for s in out.scheduled]


def test_add_request_rejects_what_could_never_run() -> None:
    sched = make_scheduler(num_blocks=5, block_size=4, max_model_len=100)  # 16 tokens of KV
    with pytest.raises(ValueError, match="at least one token"):
        sched.add_request(make_request("empty", []))
    with pytest.raises(ValueError, match=r"100 tokens.*100 tokens|100.*100"):
        sched.add_request(make_request("long", 100))
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add_request(make_request("big", 10, max_tokens=7))  # 17 tokens > 16
    sched.add_request(make_request("ok", 10, max_tokens=6))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(make_request("ok", 3))
    strict = make_scheduler(max_num_batched_tokens=8, chunked_prefill=False)
    with pytest.raises(ValueError, match="chunked prefill is off"):
        strict.add_request(make_request("x", 6, max_tokens=4))
    sched.finish_request("ok", RequestStatus.FINISHED_ABORTED)
    assert_all_free(sched)


def test_continuous_batching_new_requests_join_between_steps() -> None:
    sched = make_scheduler()
    model = FakeModel(sched)
    a = make_request("a", 5, max_tokens=6)
    sched.add_request(a)
    assert _ids(model.step()) == [("a", 5)]
    assert _ids(model.step()) == [("a", 1)]
    b = make_request("b", 7, max_tokens=3)
    sched.add_request(b)
    out = model.step()
    assert _ids(out) == [("a", 1), ("b", 7)]  # decode first, then the newcomer's prompt
    assert [s.samples for s in out.scheduled] == [True, True]
    model.run()
    assert a.output_token_ids == expected_output(a) and b.output_token_ids == expected_output(b)
    assert a.status == b.status == RequestStatus.FINISHED_LENGTH
    assert_all_free(sched)


def test_chunked_prefill_splits_a_long_prompt_and_shares_the_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=16)
    model = FakeModel(sched)
    short, long = make_request("short", 3, max_tokens=20), make_request("long", 40, max_tokens=2)
    sched.add_request(short)
    model.step()
    sched.add_request(long)
    chunks = []
    while long.num_output_tokens == 0:
        out = model.step()
        assert out.num_batched_tokens <= 16
        chunks.append([(s.request_id, s.num_new_tokens, s.start, s.samples) for s in out.scheduled])
    assert chunks == [
        [("short", 1, 3, True), ("long", 15, 0, False)],
        [("short", 1, 4, True), ("long", 15, 15, False)],
        [("short", 1, 5, True), ("long", 10, 30, True)],
    ]
    model.run()
    assert long.output_token_ids == expected_output(long)
    assert_all_free(sched)


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_whole() -> None:
    sched = make_scheduler(max_num_batched_tokens=16, chunked_prefill=False)
    model = FakeModel(sched)
    a, b = make_request("a", 4, max_tokens=3), make_request("b", 16, max_tokens=1)
    sched.add_request(a)
    sched.add_request(b)
    history = [_ids(model.step()) for _ in range(4)]
    assert history == [[("a", 4)], [("a", 1)], [("a", 1)], [("b", 16)]]
    model.run()
    assert_all_free(sched)


def test_max_num_seqs_caps_the_running_set() -> None:
    sched = make_scheduler(max_num_seqs=2)
    model = FakeModel(sched)
    reqs = [make_request(r, 3, max_tokens=2) for r in "abc"]
    for r in reqs:
        sched.add_request(r)
    assert [i for i, _ in _ids(model.step())] == ["a", "b"]
    assert sched.num_running == 2 and sched.num_waiting == 1
    model.step()  # a and b reach max_tokens and finish
    assert [i for i, _ in _ids(model.step())] == ["c"]
    model.run()
    assert_all_free(sched)


def test_prefix_hits_are_counted_and_shared_blocks_ref_counted() -> None:
    sched = make_scheduler(block_size=4)
    model = FakeModel(sched)
    shared = list(range(500, 512))  # three full blocks
    a, b = (
        make_request("a", shared + [1, 2], max_tokens=4),
        make_request("b", shared + [3], max_tokens=4),
    )
    sched.add_request(a)
    model.step()
    sched.add_request(b)
    out = model.step()
    assert [(s.request_id, s.start, s.num_new_tokens) for s in out.scheduled] == [
        ("a", 14, 1),
        ("b", 12, 1),
    ]
    assert b.num_cached_tokens == 12 and a.num_cached_tokens == 0
    table_a, table_b = sched.kv_cache.block_table("a"), sched.kv_cache.block_table("b")
    assert table_a[:3] == table_b[:3] and table_a[3] != table_b[3]
    assert [sched.kv_cache.pool.ref_count(blk) for blk in table_b] == [2, 2, 2, 1]
    stats = sched.stats
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (14 + 13, 12)
    assert_block_invariants(sched)
    model.run()
    assert b.output_token_ids == expected_output(b)
    assert_all_free(sched)


def test_a_sibling_waits_for_its_first_childs_prompt_then_shares_it() -> None:
    sched = make_scheduler(block_size=4)
    model = FakeModel(sched)
    prompt = list(range(20))
    first = make_request("p-0", prompt, max_tokens=3)
    second = make_request("p-1", prompt, max_tokens=3, sibling_of="p-0")
    other = make_request("x", 5, max_tokens=3)
    for r in (first, second, other):
        sched.add_request(r)
    assert _ids(model.step()) == [("p-0", 20), ("x", 5)]  # the sibling doesn't block x
    out = model.step()
    assert _ids(out) == [("p-0", 1), ("x", 1), ("p-1", 4)]
    assert second.num_cached_tokens == 16
    assert sched.kv_cache.block_table("p-1")[:4] == sched.kv_cache.block_table("p-0")[:4]
    model.run()
    assert second.output_token_ids == first.output_token_ids == expected_output(first)
    assert_all_free(sched)


def test_a_sibling_is_released_when_its_first_child_is_aborted() -> None:
    sched = make_scheduler(block_size=4, max_num_batched_tokens=8)
    model = FakeModel(sched)
    prompt = list(range(20))
    sched.add_request(make_request("p-0", prompt, max_tokens=3))
    second = make_request("p-1", prompt, max_tokens=3, sibling_of="p-0")
    sched.add_request(second)
    assert _ids(model.step()) == [("p-0", 8)]
    sched.finish_request("p-0", RequestStatus.FINISHED_ABORTED)
    assert _ids(model.step()) == [("p-1", 8)]
    assert second.num_cached_tokens == 8  # the aborted child's finished blocks still hit
    model.run()
    assert second.output_token_ids == expected_output(second)
    assert_all_free(sched)


def test_preemption_under_a_tiny_pool_and_every_request_still_finishes() -> None:
    sched = make_scheduler(num_blocks=9, block_size=4)  # 8 usable blocks: 32 tokens
    model = FakeModel(sched)
    reqs = [make_request(r, 6, max_tokens=10) for r in "abcd"]  # 4 blocks each at most
    for r in reqs:
        sched.add_request(r)
    first_preempted: list[str] = []
    for _ in range(500):
        if not sched.has_unfinished():
            break
        out = model.step()
        assert_block_invariants(sched)
        if out.preempted and not first_preempted:
            first_preempted = out.preempted
            victim = sched.waiting[0]
            assert victim.request_id == out.preempted[-1]
            assert victim.status == RequestStatus.PREEMPTED and victim.num_computed_tokens == 0
            assert sched.kv_cache.block_table(victim.request_id) == []
    # a's third block evicts the newest (d); c then finds no block and preempts itself.
    assert first_preempted == ["d", "c"]
    assert sched.stats.num_preemptions == sum(r.num_preemptions for r in reqs) > 0
    for r in reqs:
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == expected_output(r)
    assert_all_free(sched)


def test_waiting_requests_are_admitted_first_come_first_served() -> None:
    sched = make_scheduler(num_blocks=9, block_size=4)  # 8 usable blocks
    model = FakeModel(sched)
    big, blocked, small = (
        make_request("big", 20, 8),
        make_request("blocked", 16, 4),
        make_request("small", 3, 1),
    )
    sched.add_request(big)
    model.step()  # big holds 5 blocks; 3 are left
    sched.add_request(blocked)
    sched.add_request(small)
    assert _ids(model.step()) == [("big", 1)]  # small would fit, but must not jump the queue
    assert [r.request_id for r in sched.waiting] == ["blocked", "small"]
    model.run()
    assert_all_free(sched)


@pytest.mark.parametrize("when", ["waiting", "mid_prefill", "mid_decode", "during_step"])
def test_finish_request_frees_every_block_at_any_moment(when: str) -> None:
    sched = make_scheduler(max_num_batched_tokens=8, max_num_seqs=1)
    model = FakeModel(sched)
    a, b = make_request("a", 20, max_tokens=5), make_request("b", 6, max_tokens=2)
    sched.add_request(a)
    sched.add_request(b)
    model.step()  # a computed 8 of 20, b waits for a seat
    victim = {"waiting": b, "mid_prefill": a, "mid_decode": a, "during_step": a}[when]
    if when == "mid_decode":
        while a.num_output_tokens < 2:
            model.step()
    if when == "during_step":
        out = sched.schedule()
        sched.finish_request("a", RequestStatus.FINISHED_ABORTED)
        sched.update_from_output(out, {"a": 1})
        assert a.num_computed_tokens == 8 and a.output_token_ids == []
    else:
        sched.finish_request(victim.request_id, RequestStatus.FINISHED_ABORTED)
    assert victim.status == RequestStatus.FINISHED_ABORTED
    assert sched.kv_cache.block_table(victim.request_id) == []
    assert_block_invariants(sched)
    model.run()
    assert_all_free(sched)


def test_finish_request_is_idempotent_and_reported_once() -> None:
    sched = make_scheduler()
    model = FakeModel(sched)
    sched.add_request(make_request("a", 5))
    model.step()
    sched.finish_request("a", RequestStatus.FINISHED_STOPPED)
    sched.finish_request("a", RequestStatus.FINISHED_ABORTED)
    sched.finish_request("unknown", RequestStatus.FINISHED_ABORTED)
    with pytest.raises(ValueError, match="not a finished status"):
        sched.finish_request("a", RequestStatus.RUNNING)
    assert sched.schedule().finished_ids == ["a"]
    assert sched.schedule().finished_ids == []
    assert not sched.has_unfinished()
    assert_all_free(sched)


def test_stats_snapshot() -> None:
    sched = make_scheduler(num_blocks=11, block_size=4)
    model = FakeModel(sched)
    sched.add_request(make_request("a", 5))
    sched.add_request(make_request("b", 9))
    model.step()
    stats = sched.stats
    assert (stats.num_running, stats.num_waiting) == (2, 0)
    assert (stats.kv_blocks_used, stats.kv_blocks_total, stats.kv_usage) == (5, 10, 0.5)
    assert stats.num_scheduled_tokens == 14 and stats.num_preemptions == 0
    sched.finish_request("a", RequestStatus.FINISHED_ABORTED)
    sched.finish_request("b", RequestStatus.FINISHED_ABORTED)
    assert sched.stats.kv_blocks_used == 0
