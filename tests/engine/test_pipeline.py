"""The step pipeline on the CPU (reference ops): buffers and their swap, stage-1 packing with
placeholders and graph padding, the static decode-plan layout, and overlap scheduling's
late-stop handling, all against the one-step-at-a-time engine as the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tessel.engine import LLM, SamplingParams
from tessel.engine.kv_cache.block_tables import BlockTables
from tessel.engine.request import Request
from tessel.engine.runner.buffers import DoubleBuffer, input_specs
from tessel.engine.runner.step_inputs import PLACEHOLDER, prepare_step
from tessel.engine.scheduler.output import ScheduledRequest
from tessel.kernels.attention.decode_plan import DecodeConfig, StaticDecodePlan
from tessel.kernels.attention.plan import plan_decode_tiles
from tests.checkpoints import write_tiny_checkpoint

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("pipeline"), "llama")


def make_llm(directory: Path, overlap: bool, **kw: object) -> LLM:
    return LLM(str(directory), device="cpu", overlap_scheduling=overlap, **kw)


def run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams], every: int = 2) -> list[list[int]]:
    """Staggered arrivals; returns each request's tokens and checks every block came back."""
    core = llm.core
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    pending = list(enumerate(zip(prompts, params, strict=True)))
    step = 0
    while pending or core.has_unfinished():
        if pending and step % every == 0:
            i, (prompt, p) = pending.pop(0)
            core.add_request(str(i), prompt, p)
        for out in core.step():
            tokens[out.request_id].extend(out.outputs[0].token_ids)
        step += 1
    stats = core.stats()
    assert stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0
    return [tokens[str(i)] for i in range(len(prompts))]


PROMPTS = [[5, 17, 33, 90, 41, 7], [100, 3], list(range(3, 60)), [250, 251, 252, 9, 9, 9, 9], [42]]


def test_overlap_gives_the_same_greedy_tokens(tiny_dir: Path) -> None:
    greedy = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (9, 3, 12, 1, 7)]
    off = run(make_llm(tiny_dir, False), PROMPTS, greedy)
    llm = make_llm(tiny_dir, True)
    on = run(llm, PROMPTS, greedy)
    assert on == off
    assert [len(t) for t in on] == [9, 3, 12, 1, 7]
    stats = llm.core.stats()
    # Each request is scheduled at most once after its last token: one wasted step each at most.
    assert 0 < stats.wasted_tokens_total <= len(PROMPTS)
    assert set(stats.stage_seconds_total) == {"prepare", "copy", "compute", "aggregate", "return"}
    assert stats.steps_total > 0


def test_late_stop_drops_nothing_and_leaks_nothing(tiny_dir: Path) -> None:
    """A request that stops on a stop token mid-batch: the step already launched for it is
    wasted, its tokens end at the stop exactly as without overlap, and its blocks come back."""
    probe = run(make_llm(tiny_dir, False), PROMPTS[:1], [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)])
    stop_token = probe[0][4]  # stop where the 5th token is first generated
    params = [
        SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_token]),
        *[SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True) for _ in PROMPTS[1:]],
    ]
    off = run(make_llm(tiny_dir, False), PROMPTS, params, every=1)
    on = run(make_llm(tiny_dir, True), PROMPTS, params, every=1)
    assert on == off
    assert on[0][-1] == stop_token and len(on[0]) == probe[0].index(stop_token) + 1


def test_overlap_with_penalties_and_seeds_matches(tiny_dir: Path) -> None:
    """Penalties read output tokens: the engine completes the step in flight before scheduling."""
    params = [
        SamplingParams(temperature=0.8, seed=7, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=0.0, presence_penalty=1.5, frequency_penalty=0.5, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=3, top_k=20, max_tokens=6, ignore_eos=True, logprobs=2),
    ]
    prompts = PROMPTS[:3]
    assert run(make_llm(tiny_dir, True), prompts, params) == run(make_llm(tiny_dir, False), prompts, params)


def test_abort_while_a_step_is_in_flight(tiny_dir: Path) -> None:
    llm = make_llm(tiny_dir, True)
    core = llm.core
    core.add_request("a", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    core.add_request("b", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    got: dict[str, list[int]] = {"a": [], "b": []}
    for _ in range(3):
        for out in core.step():
            got[out.request_id].extend(out.outputs[0].token_ids)
    core.abort("a")
    while core.has_unfinished():
        for out in core.step():
            assert out.request_id == "b"
            got["b"].extend(out.outputs[0].token_ids)
    assert len(got["b"]) == 5 and core.stats().kv_blocks_used == 0


# ---- buffers and stage 1 ------------------------------------------------------------------


def _scheduled(
    prompt: list[int], outputs: list[int], start: int, n: int, blocks: list[int], tables: BlockTables
) -> ScheduledRequest:
    from tessel.engine.sampling_params import SamplingParams as SP

    r = Request(f"r{len(prompt)}-{start}", list(prompt), SP(max_tokens=8), max_tokens=8)
    r.output_token_ids = list(outputs)
    tables.append(r.request_id, 0, blocks)
    return ScheduledRequest(r, n, start, tables.row(r.request_id), len(blocks))


def test_double_buffer_alternates_and_stage1_packs() -> None:
    tables = BlockTables()
    db = DoubleBuffer(input_specs(max_tokens=32, max_seqs=4, max_blocks=4, plan_size=0), CPU)
    a, b, c = db.acquire(), db.acquire(), db.acquire()
    assert a is c and a is not b and (a.index, b.index) == (0, 1)
    decode = _scheduled([1, 2, 3, 4, 5], [6, PLACEHOLDER], start=6, n=1, blocks=[3, 7], tables=tables)
    prefill = _scheduled([9, 8, 7], [], start=0, n=3, blocks=[2], tables=tables)
    step = prepare_step([decode, prefill], tables.array, b, block_size=4, prev_rows={decode.request_id: 5})
    assert b.device_view("input_ids").tolist() == [PLACEHOLDER, 9, 8, 7]
    assert b.device_view("positions").tolist() == [6, 0, 1, 2]
    assert b.device_view("slot_mapping").tolist() == [7 * 4 + 2, 8, 9, 10]
    assert b.device_view("block_tables").view(2, 2).tolist() == [[3, 7], [2, 0]]
    assert b.device_view("seq_lens").tolist() == [7, 3]
    assert (b.device_view("prev_src").tolist(), b.device_view("prev_dst").tolist()) == ([5], [0])
    assert b.device_view("logits_indices").tolist() == [0, 3]
    assert step.num_from_prev == 1 and not step.is_decode_only


def test_stage1_pads_a_decode_step_to_its_graph_size() -> None:
    tables = BlockTables()
    db = DoubleBuffer(input_specs(max_tokens=32, max_seqs=8, max_blocks=4, plan_size=0), CPU)
    buf = db.acquire()
    reqs = [_scheduled([1, 2, 3], [4], start=3, n=1, blocks=[1], tables=tables), _scheduled([5, 6], [7, 8], start=3, n=1, blocks=[2], tables=tables)]
    step = prepare_step(reqs, tables.array, buf, block_size=4, prev_rows={}, graph_batch=4)
    assert (step.batch, step.num_real, step.num_tokens) == (4, 2, 4)
    assert buf.device_view("slot_mapping").tolist() == [4 + 3, 8 + 3, -1, -1]  # padded rows write nothing
    assert buf.device_view("seq_lens").tolist() == [4, 4, 1, 1]
    assert buf.device_view("input_ids").tolist() == [4, 8, 0, 0]



def test_stage1_maps_each_placeholder_to_its_previous_row_and_skips_partial_chunks() -> None:
    tables = BlockTables()
    db = DoubleBuffer(input_specs(max_tokens=32, max_seqs=4, max_blocks=4, plan_size=0), CPU)
    buf = db.acquire()
    first = _scheduled([1, 2], [3, PLACEHOLDER], start=3, n=1, blocks=[4], tables=tables)
    chunk = _scheduled([9, 8, 7, 6, 5, 4], [], start=0, n=4, blocks=[1, 6], tables=tables)  # the prompt's first 4
    last = _scheduled([1, 2, 3], [PLACEHOLDER], start=3, n=1, blocks=[5], tables=tables)
    step = prepare_step([first, chunk, last], tables.array, buf, block_size=4,
                        prev_rows={first.request_id: 2, last.request_id: 0})
    assert buf.device_view("input_ids").tolist() == [PLACEHOLDER, 9, 8, 7, 6, PLACEHOLDER]
    assert (buf.device_view("prev_src").tolist(), buf.device_view("prev_dst").tolist()) == ([2, 0], [0, 5])
    assert buf.device_view("logits_indices").tolist() == [0, 5]  # the chunk samples nothing
    assert [s.request_id for s in step.sampling] == [first.request_id, last.request_id]
    assert buf.device_view("block_tables").view(3, 2).tolist() == [[4, 0], [1, 6], [5, 0]]
    assert buf.device_view("slot_mapping").tolist() == [4 * 4 + 3, 4, 5, 6, 7, 5 * 4 + 3]

@pytest.mark.parametrize("mode", ["balanced", "static", "none"])
def test_static_plan_layout_is_fixed_by_batch_size(mode: str) -> None:
    """Two different plans of one padded size launch with identical arguments (what a graph
    replays), and the flat array decodes back to the planner's own tiles."""
    sp = StaticDecodePlan(16, 8, 2, 64, CPU, DecodeConfig(mode=mode), max_seq_len=4096)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    layouts = []
    for _ in range(2):
        lens = rng.integers(1, 4096, size=8).astype(np.int32)
        host = np.full(sp.size, -7, dtype=np.int32)
        plan = sp.plan(lens, host)
        layouts.append((plan.offsets, plan.grid_buckets, plan.tile_capacity))
        c, b_off, f_off, n_off = plan.offsets
        ref = plan.host
        n = ref.num_tiles
        assert np.array_equal(host[:n], ref.tile_req) and np.array_equal(host[2 * c : 2 * c + n], ref.tile_end)
        ptr = host[b_off : b_off + plan.grid_buckets + 1]
        assert ptr[0] == 0 and ptr[-1] == n and np.all(np.diff(ptr) >= 0)
        assert np.array_equal(host[f_off : f_off + 8], ref.req_first_tile)
        assert np.array_equal(host[n_off : n_off + 8], ref.req_num_tiles)
        # every token of every request is covered exactly once
        cover = np.zeros(int(lens.sum()), dtype=np.int64)
        base = np.concatenate(([0], np.cumsum(lens)[:-1]))
        for t in range(n):
            cover[base[host[t]] + host[c + t] : base[host[t]] + host[2 * c + t]] += 1
        assert np.all(cover == 1)
    assert layouts[0] == layouts[1]
    expected = plan_decode_tiles(lens, num_buckets=sp.num_buckets, mode=mode, num_splits=plan.host.req_num_tiles.max())  # type: ignore[arg-type]
    assert expected.num_tiles <= plan.tile_capacity
