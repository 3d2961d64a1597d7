"""``AsyncEngine`` with its core in a child process (``engine_process.py``).

The streams, their queues, coalescing and aborts on leaving are the base class's. What
differs is where requests go and where outputs come from: ``generate`` queues an add and
pokes, which here sends it down at once; one executor thread waits on the child's events and
the loop task hands them out (admissions, refusals, outputs, failed steps). The core steps
on without waiting for the loop, so a busy event loop no longer holds up the GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from typing import Any

from tessel.config.settings import EngineConfig
from tessel.engine.async_engine import AsyncEngine, EngineDeadError, EngineStepError, aborted_output
from tessel.engine.engine_process import (
    EngineInfo,
    Events,
    WireOutput,
    from_wire,
    run_engine_process,
)
from tessel.engine.faults import StepFaults
from tessel.engine.stats import EngineStats

log = logging.getLogger("tessel.engine")

SHUTDOWN_WAIT_S = 30.0  # for the child to stop after being told; then it is killed


def open_engine(config: EngineConfig, engine_process: str = "auto") -> AsyncEngine:
    """The engine for a server: its core in a child process ("on"), in this one ("off"), or
    "auto": a child on a GPU at tensor-parallel size 1. The CPU engine stays in-process: its
    OpenMP threads take every core, and a second busy process stalls their barriers."""
    if engine_process == "auto":
        from tessel.engine.shard_setup import resolve_device

        use = config.tensor_parallel_size == 1 and resolve_device(config).type == "cuda"
    else:
        use = engine_process == "on"
    if use and config.tensor_parallel_size > 1:
        raise ValueError("engine_process 'on' needs tensor_parallel_size 1 (the workers are this process's)")
    return ProcessAsyncEngine.from_config(config) if use else AsyncEngine.from_config(config)


class ProcessAsyncEngine(AsyncEngine):
    def __init__(
        self,
        process: mp.process.BaseProcess,
        commands: Connection,
        events: Connection,
        info: EngineInfo,
        stats: EngineStats,
    ) -> None:
        self.deliver_between_steps = False
        self._init_front(info.tokenizer, info.served_name, info.max_model_len, info.vocab_size, None)
        self.coalesce = True  # the child steps on regardless: a slow stream's deltas pile up
        self._process = process
        self._commands = commands
        self._events = events
        self._stats = stats
        self._busy = False
        self._closing = False

    @classmethod
    def from_config(cls, config: EngineConfig) -> ProcessAsyncEngine:
        """Start the child and wait until it has loaded the model (or failed to)."""
        ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
        commands_out, commands_in = ctx.Pipe(duplex=False)  # (receiving end, sending end)
        events_out, events_in = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=run_engine_process, args=(config, commands_out, events_in), name="tessel-engine", daemon=True
        )
        process.start()
        commands_out.close()
        events_in.close()
        try:
            kind, payload = events_out.recv()
        except EOFError:
            process.join(5)
            raise RuntimeError(f"the engine process exited while loading (exit code {process.exitcode})") from None
        if kind != "ready":
            process.join(5)
            raise RuntimeError(f"the engine process failed to load the model: {payload}")
        _, first = events_out.recv()  # the stats before any request
        return cls(process, commands_in, events_out, payload, first.stats)

    # ---- lifecycle -------------------------------------------------------------------

    def _watch_workers(self) -> None:
        pass  # no workers here: the child's exit is seen by the events reader

    async def shutdown(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._commands.send(("shutdown",))
        await asyncio.to_thread(self._process.join, SHUTDOWN_WAIT_S)
        if self._process.is_alive():
            log.warning("the engine process did not stop within %.0f s; killing it", SHUTDOWN_WAIT_S)
            self._process.kill()
            await asyncio.to_thread(self._process.join, 5)
        if self._task is not None:
            # the child is gone, so the reader thread sees the pipe close and returns
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._commands.close()
        self._events.close()

    def stats(self) -> EngineStats:
        return self._stats

    def seconds_without_progress(self) -> float:
        if not (self._busy or self._pending_adds):
            return 0.0
        return time.monotonic() - self.last_progress

    def inject_step_fault(self, kind: str = "raise", seconds: float = 0.0) -> None:
        StepFaults().inject(kind, seconds)  # a bad kind is refused here, not in the child
        self._send(("fault", kind, seconds))

    # ---- requests --------------------------------------------------------------------

    def _poke(self) -> None:
        """Send what ``generate`` and ``abort`` queued straight to the child."""
        adds, self._pending_adds = self._pending_adds, []
        for rid, prompt, params in adds:
            self._busy = True
            self._send(("add", rid, prompt, params))
        aborts, self._pending_aborts = self._pending_aborts, []
        for rid in aborts:
            self._send(("abort", rid))

    def _send(self, command: tuple[Any, ...]) -> None:
        if self.fatal_error is not None:
            return  # the streams have been failed already
        try:
            self._commands.send(command)
        except OSError as exc:  # the child is gone; the reader reports it
            log.warning("could not reach the engine process: %s", exc)

    # ---- the loop --------------------------------------------------------------------

    def _receive(self) -> list[Events]:
        """Executor thread: block for the child's next message, then take any already waiting."""
        messages = []
        while True:
            kind, payload = self._events.recv()  # EOFError: the child died
            messages.append(payload)
            if not self._events.poll(0):
                return messages

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                messages = await loop.run_in_executor(self._executor, self._receive)
            except (EOFError, OSError):
                if self._closing:
                    return
                await asyncio.to_thread(self._process.join, 5)
                code = self._process.exitcode
                self._die(EngineDeadError(f"the engine process exited (exit code {code})"))
                return
            for events in messages:
                self._handle(events)

    def _handle(self, events: Events) -> None:
        self.last_progress = time.monotonic()
        for rid in events.admitted:
            stream = self._streams.get(rid)
            if stream is not None and not stream.admitted.done():
                stream.admitted.set_result(None)
        for rid, message in events.refused:
            stream = self._streams.get(rid)
            if stream is not None and not stream.admitted.done():
                stream.admitted.set_exception(ValueError(message))
        self._deliver(events.outputs)
        for rid in events.aborted:
            stream = self._streams.get(rid)
            if stream is not None:  # aborted from outside: tell the stream it is over
                stream.queue.put_nowait(aborted_output(rid))
        if events.failed is not None:
            rids, message = events.failed
            for rid in rids:
                stream = self._streams.get(rid)
                if stream is not None:
                    stream.queue.put_nowait(EngineStepError(message))
        if events.stats is not None:
            self._stats = events.stats
        self._busy = events.busy

    def _deliver(self, outputs: list[WireOutput]) -> None:
        for item in outputs:
            out = from_wire(item)
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream.queue.put_nowait(out)

    def _abandon_core(self) -> None:
        if self._process.is_alive():
            self._process.kill()
