"""Random workloads against the scheduler: arrivals, aborts, shared prefixes, siblings,
tiny pools. Block invariants hold every step, nothing starves, everything is freed."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessel.engine.request import Request, RequestStatus
from tests.factories import (
    FakeModel,
    assert_all_free,
    assert_block_invariants,
    expected_output,
    make_request,
    make_scheduler,
)


@dataclass
class Arrival:
    step: int  # when it is added
    prefix_len: int  # leading tokens taken from one prefix common to the workload
    tail: list[int]  # then its own tokens
    max_tokens: int
    abort_after: int | None  # steps after arrival at which it is aborted, if still alive
    sibling: bool  # copy the previous request's prompt and name it as sibling_of


COMMON_PREFIX = list(range(100, 124))

arrivals = st.builds(
    Arrival,
    step=st.integers(0, 6),
    prefix_len=st.integers(0, 24),
    tail=st.lists(st.integers(0, 3), min_size=1, max_size=16),
    max_tokens=st.integers(1, 12),
    abort_after=st.none() | st.integers(0, 8),
    sibling=st.booleans(),
)


@settings(
    max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    workload=st.lists(arrivals, min_size=1, max_size=12),
    block_size=st.sampled_from([1, 2, 4]),
    num_blocks=st.integers(6, 16),
    budget=st.integers(4, 48),
    max_num_seqs=st.integers(1, 6),
    chunked=st.booleans(),
    prefix_caching=st.booleans(),
)
def test_random_workloads_keep_invariants_and_all_finish(
    workload: list[Arrival],
    block_size: int,
    num_blocks: int,
    budget: int,
    max_num_seqs: int,
    chunked: bool,
    prefix_caching: bool,
) -> None:
    sched = make_scheduler(num_blocks, block_size, max_num_seqs, budget, prefix_caching, chunked)
    model = FakeModel(sched)
    # Largest prompt + max_tokens the scheduler accepts: the whole cache, and without
    # chunking, the token budget (+1: the last token's KV is never computed).
    longest = (
        (num_blocks - 1) * block_size if chunked else min((num_blocks - 1) * block_size, budget + 1)
    )
    requests: list[tuple[Request, Arrival]] = []
    by_step: dict[int, list[Arrival]] = {}
    for arrival in sorted(workload, key=lambda a: a.step):
        by_step.setdefault(arrival.step, []).append(arrival)
    aborts: dict[int, list[str]] = {}
    step = 0
    while step <= 6 or sched.has_unfinished():
        for arrival in by_step.get(step, []):
            request = _make(len(requests), arrival, requests, longest)
            sched.add_request(request)
            requests.append((request, arrival))
            if arrival.abort_after is not None:
                aborts.setdefault(step + arrival.abort_after, []).append(request.request_id)
        for rid in aborts.get(step, []):
            sched.finish_request(rid, RequestStatus.FINISHED_ABORTED)
        model.step()
        assert_block_invariants(sched)
        step += 1
        assert step < 2_000, "a request starved"
    assert_all_free(sched)
    for request, _ in requests:
        assert request.is_finished
        if request.status == RequestStatus.FINISHED_LENGTH:
            assert request.output_token_ids == expected_output(request)
        else:
            assert request.output_token_ids == expected_output(request)[: request.num_output_tokens]


def _make(
    index: int, arrival: Arrival, earlier: list[tuple[Request, Arrival]], longest: int
) -> Request:
    """A request for this arrival, trimmed to what the scheduler accepts."""
    sibling_of = None
    prompt = COMMON_PREFIX[: arrival.prefix_len] + arrival.tail
    if arrival.sibling and earlier:
        sibling_of, prompt = earlier[-1][0].request_id, earlier[-1][0].prompt_token_ids
    max_tokens = max(1, min(arrival.max_tokens, longest - 1))
    prompt = prompt[: longest - max_tokens]
    return make_request(f"r{index}", prompt, max_tokens=max_tokens, sibling_of=sibling_of)
