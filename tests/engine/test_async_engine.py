"""The asyncio engine: concurrent streams equal the offline engine; leaving or aborting frees KV."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tessel.engine import LLM, AsyncEngine, SamplingParams
from tessel.engine.async_engine import EngineDeadError
from tessel.engine.llm import engine_config_from_kwargs
from tessel.engine.process_engine import open_engine
from tests.checkpoints import write_tiny_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = [[5, 6, 7], [9] * 20, [11, 12], list(range(3, 40)), [42]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), "llama")


async def _collect(engine: AsyncEngine, prompt: list[int], params: SamplingParams, rid: str) -> list[int]:
    tokens: list[int] = []
    async for out in engine.generate(prompt, params, rid):
        for choice in out.outputs:
            tokens.extend(choice.token_ids)
    return tokens


async def test_concurrent_streams_equal_offline(tiny_dir: Path) -> None:
    expected = [o.outputs[0].token_ids for o in LLM(str(tiny_dir)).generate(PROMPTS, GREEDY)]
    engine = AsyncEngine.from_config(engine_config_from_kwargs(str(tiny_dir), block_size=4))
    await engine.start()
    try:
        got = await asyncio.gather(*(_collect(engine, p, GREEDY, f"r{i}") for i, p in enumerate(PROMPTS)))
        assert list(got) == expected
        assert engine.stats().kv_blocks_used == 0
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("engine_process", ["off", "on"], ids=["in-process", "engine-process"])
async def test_leaving_a_stream_or_aborting_frees_every_block(tiny_dir: Path, engine_process: str) -> None:
    config = engine_config_from_kwargs(str(tiny_dir), block_size=4)
    engine = await asyncio.to_thread(open_engine, config, engine_process)
    await engine.start()
    long = SamplingParams(temperature=0.0, max_tokens=190, ignore_eos=True)
    try:
        stream = engine.generate(list(range(3, 60)), long, "leaver")
        await anext(stream)  # first token out: mid-decode
        await stream.aclose()  # the client went away

        async def abort_soon() -> None:
            await asyncio.sleep(0.05)
            await engine.abort("aborted")

        task = asyncio.create_task(abort_soon())
        tokens = await asyncio.wait_for(_collect(engine, list(range(3, 60)), long, "aborted"), 30)
        await task
        assert len(tokens) < 190
        for _ in range(100):  # aborts apply at the next step boundary
            if engine.stats().kv_blocks_used == 0 and engine.stats().num_running == 0:
                break
            await asyncio.sleep(0.02)
        stats = engine.stats()
        assert stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0
        # and it still serves
        assert len(await _collect(engine, [5, 6, 7], GREEDY, "after")) == 10
    finally:
        await engine.shutdown()


async def test_bad_prompts_raise_clear_errors(tiny_dir: Path) -> None:
    engine = AsyncEngine.from_config(engine_config_from_kwargs(str(tiny_dir), max_model_len=64))
    await engine.start()
    try:
        with pytest.raises(ValueError, match="maximum context length is 64"):
            await _collect(engine, list(range(3, 70)), GREEDY, "too-long")
        with pytest.raises(ValueError, match="max_tokens is 60"):
            await _collect(engine, [5] * 10, SamplingParams(max_tokens=60), "over")
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await _collect(engine, [10**6], GREEDY, "bad-id")
        with pytest.raises(ValueError, match="empty"):
            await _collect(engine, [], GREEDY, "empty")
        assert engine.stats().kv_blocks_used == 0
    finally:
        await engine.shutdown()


async def test_a_caller_cancelled_before_admission_does_not_stop_the_loop(tiny_dir: Path) -> None:
    """Cancelling a caller cancels its admission wait at once, but its clean-up (unlisting its
    stream) runs a loop turn later; admitting in between once killed the loop for good."""
    engine = AsyncEngine.from_config(engine_config_from_kwargs(str(tiny_dir), block_size=4))
    await engine.start()
    try:
        caller = asyncio.create_task(_collect(engine, [5, 6, 7], GREEDY, "gone"))
        await asyncio.sleep(0)  # the caller now waits for admission
        caller.cancel()
        engine._apply_pending()  # what the loop may run in that turn
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert len(await asyncio.wait_for(_collect(engine, [5, 6, 7], GREEDY, "next"), 30)) == 10
        assert engine.is_alive()
    finally:
        await engine.shutdown()


async def test_a_dead_loop_refuses_requests_instead_of_hanging(tiny_dir: Path) -> None:
    engine = AsyncEngine.from_config(engine_config_from_kwargs(str(tiny_dir), block_size=4))
    await engine.start()
    try:
        engine._apply_pending = lambda: 1 / 0  # type: ignore[method-assign]
        engine._poke()
        await asyncio.sleep(0.05)
        assert not engine.is_alive()
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(_collect(engine, [5, 6, 7], GREEDY, "late"), 10)
    finally:
        await engine.shutdown()


async def test_built_on_the_thread_that_steps_and_outputs_taken_between_steps(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU every torch thread keeps its own OpenMP team and a second team slows every
    step, so the engine is built on its step thread; and the streams take each step's
    outputs before the next step starts, rather than beside it."""
    import threading

    from tessel.engine import async_engine

    built_on: list[str] = []
    real_build = async_engine.build_engine_parts

    def build(config: object) -> object:
        built_on.append(threading.current_thread().name)
        return real_build(config)  # type: ignore[arg-type]

    monkeypatch.setattr(async_engine, "build_engine_parts", build)
    monkeypatch.setattr(async_engine, "_DELIVERY_WAIT_S", 10.0)  # a loaded CI box is no excuse here
    engine = AsyncEngine.from_config(engine_config_from_kwargs(str(tiny_dir), block_size=4))
    assert engine.deliver_between_steps  # a CPU engine
    stepped_on: set[str] = set()
    undelivered: list[int] = []
    real_step = engine.core.step

    def step() -> list:  # type: ignore[type-arg]
        stepped_on.add(threading.current_thread().name)
        undelivered.append(sum(s.queue.qsize() for s in list(engine._streams.values())))
        return real_step()

    engine.core.step = step  # type: ignore[method-assign]
    await engine.start()
    try:
        await asyncio.gather(*(_collect(engine, p, GREEDY, f"r{i}") for i, p in enumerate(PROMPTS)))
    finally:
        await engine.shutdown()
    assert stepped_on == set(built_on) and len(built_on) == 1
    assert undelivered and max(undelivered) == 0


async def test_a_stream_that_falls_behind_gets_its_tokens_merged(tiny_dir: Path) -> None:
    """Deltas that piled up while the consumer was busy arrive as one, with nothing lost:
    the tokens, text and logprobs joined equal the offline engine's (logprobs to float rounding:
    the block sizes differ)."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1)
    want = LLM(str(tiny_dir)).generate([PROMPTS[3]], params)[0].outputs[0]
    engine = AsyncEngine.from_config(engine_config_from_kwargs(str(tiny_dir), block_size=4))
    engine.coalesce = True  # TESSEL_STREAM_COALESCE=1
    await engine.start()
    try:
        deltas = []
        async for out in engine.generate(PROMPTS[3], params, "slow"):
            deltas.append(out.outputs[0])
            if len(deltas) == 2:
                await asyncio.sleep(0.5)  # the engine runs on; this stream's queue fills
        assert [t for d in deltas for t in d.token_ids] == want.token_ids
        assert "".join(d.text for d in deltas) == want.text
        got = [lp for d in deltas for lp in d.logprobs or []]
        assert [lp.token_id for lp in got] == [lp.token_id for lp in want.logprobs or []]
        assert [lp.logprob for lp in got] == pytest.approx([lp.logprob for lp in want.logprobs or []], abs=1e-5)
        assert deltas[-1].finish_reason == "length" and len(deltas) < len(want.token_ids)
        assert engine.stats().kv_blocks_used == 0
    finally:
        await engine.shutdown()
