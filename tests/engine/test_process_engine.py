"""The engine core in a child process: the same streams as in-process, refusals and failed
steps reported per request, a dead child never leaves a stream hanging. (Leaving and aborting
run against both engines in ``test_async_engine.py``.)"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tessel.engine import LLM, SamplingParams
from tessel.engine.async_engine import EngineDeadError, EngineStepError
from tessel.engine.llm import engine_config_from_kwargs
from tessel.engine.process_engine import ProcessAsyncEngine, open_engine
from tests.checkpoints import write_tiny_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=190, ignore_eos=True)
PROMPTS = [[5, 6, 7], [9] * 20, [11, 12], list(range(3, 40)), [42]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), "llama")


@pytest.fixture
async def engine(tiny_dir: Path) -> AsyncIterator[ProcessAsyncEngine]:
    config = engine_config_from_kwargs(str(tiny_dir), block_size=4, max_model_len=256)
    eng = await asyncio.to_thread(open_engine, config, "on")
    assert isinstance(eng, ProcessAsyncEngine)
    await eng.start()
    try:
        yield eng
    finally:
        await eng.shutdown()
    assert not eng._process.is_alive()


async def _collect(engine: ProcessAsyncEngine, prompt: list[int], params: SamplingParams, rid: str) -> list[int]:
    return [t async for out in engine.generate(prompt, params, rid) for t in out.outputs[0].token_ids]


async def _until_idle(engine: ProcessAsyncEngine) -> None:
    for _ in range(200):
        stats = engine.stats()
        if stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not idle: {engine.stats()}")


async def test_streams_equal_the_offline_engine(tiny_dir: Path, engine: ProcessAsyncEngine) -> None:
    expected = [o.outputs[0].token_ids for o in LLM(str(tiny_dir)).generate(PROMPTS, GREEDY)]
    got = await asyncio.gather(*(_collect(engine, p, GREEDY, f"r{i}") for i, p in enumerate(PROMPTS)))
    assert list(got) == expected
    await _until_idle(engine)
    assert engine.stats().generation_tokens_total == 10 * len(PROMPTS)
    assert engine.model_name == "tiny-llama" and engine.max_model_len == 256


async def test_a_refused_prompt_raises_and_the_engine_serves_on(engine: ProcessAsyncEngine) -> None:
    with pytest.raises(ValueError, match="maximum context length is 256"):
        await _collect(engine, list(range(3, 260)), GREEDY, "too-long")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await _collect(engine, [10_000], GREEDY, "bad-id")
    assert len(await _collect(engine, [5, 6, 7], GREEDY, "after")) == 10


async def test_a_failed_step_ends_its_requests_only(engine: ProcessAsyncEngine) -> None:
    first = engine.generate([5, 6, 7], LONG, "victim")
    await anext(first)
    engine.inject_step_fault("raise")
    with pytest.raises(EngineStepError, match="engine step failed"):
        async for _ in first:
            pass
    await _until_idle(engine)
    assert len(await _collect(engine, [5, 6, 7], GREEDY, "survivor")) == 10


async def test_a_stalled_step_shows_as_no_progress(engine: ProcessAsyncEngine) -> None:
    """What the server's watchdog reads: time without a step while work is pending."""
    stream = engine.generate([5, 6, 7], LONG, "stalled")
    await anext(stream)
    with pytest.raises(ValueError, match="fault kind"):
        engine.inject_step_fault("hang")
    engine.inject_step_fault("stall", 1.5)
    await asyncio.sleep(1.0)
    assert engine.seconds_without_progress() > 0.5
    assert len([t async for out in stream for t in out.outputs[0].token_ids]) > 0  # it ends after the stall
    for _ in range(100):  # the child's last message says it has nothing left to do
        if engine.seconds_without_progress() == 0.0:
            break
        await asyncio.sleep(0.02)
    assert engine.seconds_without_progress() == 0.0


async def test_a_dead_child_fails_the_streams_instead_of_hanging(tiny_dir: Path) -> None:
    engine = await asyncio.to_thread(
        ProcessAsyncEngine.from_config, engine_config_from_kwargs(str(tiny_dir), block_size=4)
    )
    fatal: list[BaseException] = []
    engine.on_fatal(fatal.append)
    await engine.start()
    try:
        stream = engine.generate([5, 6, 7], LONG, "orphan")
        await anext(stream)
        assert engine._process.pid is not None
        os.kill(engine._process.pid, signal.SIGKILL)
        with pytest.raises((EngineDeadError, EngineStepError)):
            await asyncio.wait_for(_drain(stream), 30)
        assert not engine.is_alive() and fatal
        with pytest.raises((EngineDeadError, EngineStepError)):
            await asyncio.wait_for(_collect(engine, [5], GREEDY, "late"), 10)
    finally:
        await engine.shutdown()


async def _drain(stream: AsyncIterator[object]) -> None:
    async for _ in stream:
        pass


def test_auto_keeps_the_cpu_engine_in_process(tiny_dir: Path) -> None:
    from tessel.engine import AsyncEngine

    engine = open_engine(engine_config_from_kwargs(str(tiny_dir)), "auto")
    assert type(engine) is AsyncEngine
    engine._executor.shutdown()
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        open_engine(engine_config_from_kwargs(str(tiny_dir), tensor_parallel_size=2), "on")


def test_outputs_cross_the_pipe_as_tuples_until_the_request_finishes() -> None:
    import pickle

    from tessel.engine.engine_process import from_wire, to_wire
    from tessel.engine.request import CompletionOutput, Logprob, RequestMetrics, RequestOutput

    choices = [CompletionOutput(1, " b", [8], logprobs=[Logprob(8, -0.5, [(8, -0.5)])]), CompletionOutput(0, "a", [7])]
    mid = RequestOutput("r", [1, 2, 3], choices, False, prompt="p", prompt_logprobs=[None],
                        num_cached_tokens=2, metrics=RequestMetrics(1.0))
    wire = to_wire(mid)
    assert isinstance(wire, tuple)
    back = from_wire(pickle.loads(pickle.dumps(wire)))
    assert back.outputs == choices and (back.request_id, back.finished) == ("r", False)
    assert (back.prompt_logprobs, back.num_cached_tokens) == ([None], 2)
    assert (back.prompt_token_ids, back.prompt, back.metrics) == ([], None, None)  # read only at the end
    done = RequestOutput("r", [1, 2, 3], choices, True, prompt="p", metrics=RequestMetrics(1.0))
    assert to_wire(done) is done and from_wire(done) is done
