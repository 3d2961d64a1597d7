"""The asyncio front door: many concurrent ``generate`` streams over one engine loop.

The model step runs in a worker thread, so the event loop keeps serving while the model
computes. Only the loop task touches the engine core, and only between steps: new requests
and aborts are queued and applied at the next step boundary.

Under tensor parallelism a failed group (a worker died or hung, a step raised) stops the loop
for good: every stream gets the error, ``is_alive`` turns False and ``on_fatal`` callbacks run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tessel.config.settings import EngineConfig
from tessel.engine.core import EngineCore
from tessel.engine.distributed.group import TensorParallelError
from tessel.engine.engine_setup import build_engine_parts
from tessel.engine.request import (
    CompletionOutput,
    RequestOutput,
    merge_outputs,
)
from tessel.engine.sampling_params import SamplingParams
from tessel.engine.stats import EngineStats

log = logging.getLogger("tessel.engine")


class EngineStepError(RuntimeError):
    """The model step failed; the requests it carried are ended with finish_reason 'error'."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped; no request can be served until the process restarts."""


@dataclass
class _Stream:
    queue: asyncio.Queue[RequestOutput | BaseException] = field(default_factory=asyncio.Queue)
    admitted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def _coalesce(
    first: RequestOutput, queue: asyncio.Queue[RequestOutput | BaseException]
) -> tuple[RequestOutput, BaseException | None]:
    """Merge the deltas already waiting behind ``first`` into one (and return an error that
    follows them). A stream falls behind only when the event loop is slower than the steps;
    sending what has piled up as one chunk then costs its per-chunk work (JSON, SSE framing,
    a socket write) once instead of once per token, so a loaded server catches up."""
    deltas = [first]
    while not deltas[-1].finished and not queue.empty():
        item = queue.get_nowait()
        if isinstance(item, BaseException):
            return merge_outputs(deltas), item
        deltas.append(item)
    return (first if len(deltas) == 1 else merge_outputs(deltas)), None


def aborted_output(request_id: str) -> RequestOutput:
    return RequestOutput(
        request_id, [], [CompletionOutput(0, "", [], finish_reason="abort")], finished=True
    )


# How long the loop waits, at most, for the streams to take a step's outputs before the next
# step (CPU only): a stalled consumer must not stall the engine.
_DELIVERY_WAIT_S = 0.005
# Merging a lagging stream's waiting deltas into one chunk (_coalesce): off until a GPU A/B
# shows it helps (on the CPU the streams drain between steps, so nothing piles up to merge).
COALESCE_BY_DEFAULT = os.environ.get("TESSEL_STREAM_COALESCE", "0") == "1"


def _step_executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessel-step")


class AsyncEngine:
    def __init__(
        self,
        core: EngineCore,
        model_name: str,
        deliver_between_steps: bool = False,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.core = core
        # On the CPU the step's OpenMP threads use every core, and any Python work beside them
        # (streams formatting and writing their tokens) stalls a thread that the others then
        # wait for at each barrier: that costs far more than the work itself. So there the
        # streams take each step's outputs before the next step starts. On a GPU the step
        # mostly waits on the device, and the overlap is what hides the network work.
        self.deliver_between_steps = deliver_between_steps
        self._init_front(core.tokenizer, model_name, core.max_model_len, core.parts.vocab_size, executor)

    def _init_front(
        self,
        tokenizer: Any,
        model_name: str,
        max_model_len: int,
        vocab_size: int,
        executor: ThreadPoolExecutor | None,
    ) -> None:
        """The streams' side, which does not depend on where the core runs."""
        self.coalesce = COALESCE_BY_DEFAULT
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self._streams: dict[str, _Stream] = {}
        self._pending_adds: list[tuple[str, str | list[int], SamplingParams]] = []
        self._pending_aborts: list[str] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = executor or _step_executor()
        self.last_progress = time.monotonic()
        self.fatal_error: Exception | None = None
        self._fatal_callbacks: list[Callable[[BaseException], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        """Load and warm the engine on the thread that will run its steps.

        Every thread that runs torch's CPU ops keeps its own OpenMP team, and once a second
        team exists, even an idle one, libgomp sees more threads than cores and stops spinning
        between parallel regions: each of a step's hundreds of ops then pays a futex wake-up.
        Loading on one thread and stepping on another made every CPU step ~20% slower.
        """
        executor = _step_executor()
        core = executor.submit(lambda: EngineCore(build_engine_parts(config))).result()
        on_cpu = core.parts.device.type == "cpu"
        return cls(core, core.parts.served_name, on_cpu, executor)

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if self.fatal_error is not None:
            raise EngineStepError(f"the engine has stopped: {self.fatal_error}")
        if self._task is not None and self._task.done():
            # a loop that died would never admit the request: refuse it rather than hang
            raise EngineDeadError("the engine loop stopped")
        if self._task is None:
            self._wake = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.create_task(self._run(), name="tessel-engine-loop")
            self._task.add_done_callback(self._on_loop_end)
            self._watch_workers()

    def _watch_workers(self) -> None:
        """Tensor parallel: a worker that dies between steps stops the engine at once."""
        if self.core.parallel is not None:
            self.core.parallel.on_failure(self._failure_from_any_thread)

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # a loop that died has had its error logged (_on_loop_end): shut down regardless
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        # after a failure the step thread may still sit in a dead collective: do not wait for it
        self._executor.shutdown(wait=self.fatal_error is None, cancel_futures=True)
        if self.core.parallel is not None:
            await asyncio.to_thread(self.core.shutdown)

    def is_alive(self) -> bool:
        return self.fatal_error is None and self._task is not None and not self._task.done()

    def on_fatal(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback`` on the event loop once the engine has stopped for good."""
        self._fatal_callbacks.append(callback)
        if self.fatal_error is not None:
            callback(self.fatal_error)

    def stats(self) -> EngineStats:
        return self.core.stats()

    def seconds_without_progress(self) -> float:
        """How long work has been pending without a step completing; 0 while idle.
        A watchdog turns a large value into "not ready" (a stuck device or loop)."""
        if not (self.core.has_unfinished() or self._pending_adds):
            return 0.0
        return time.monotonic() - self.last_progress

    def inject_step_fault(self, kind: str = "raise", seconds: float = 0.0) -> None:
        """Test-only: make the next model step raise, or stall for ``seconds``."""
        self.core.faults.inject(kind, seconds)

    # ---- requests --------------------------------------------------------------------

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Yield deltas until the request finishes; leaving early aborts it."""
        if self.fatal_error is not None:
            raise EngineStepError(f"the engine has stopped: {self.fatal_error}")
        if not self.is_alive():
            await self.start()
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        stream = self._streams[request_id] = _Stream()
        self._pending_adds.append((request_id, prompt, params))
        self._poke()
        finished = False
        try:
            await stream.admitted  # raises the engine's ValueError for a prompt it cannot serve
            while not finished:
                item = await stream.queue.get()
                error = None
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if self.coalesce and not item.finished and not stream.queue.empty():
                    item, error = _coalesce(item, stream.queue)
                finished = item.finished or error is not None
                yield item
                if error is not None:
                    raise error
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._pending_aborts.append(request_id)
                self._poke()

    async def abort(self, request_id: str) -> None:
        self._pending_aborts.append(request_id)
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ---- the loop --------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            self._apply_pending()
            if not self.core.has_unfinished():
                self._wake.clear()
                if not self._pending_adds and not self._pending_aborts:
                    await self._wake.wait()
                self.last_progress = time.monotonic()  # idle time is not a stall
                continue
            try:
                outputs = await loop.run_in_executor(self._executor, self.core.step)
            except asyncio.CancelledError:
                raise
            except TensorParallelError as exc:
                self._die(exc)
                return
            except Exception as exc:  # a failed step must not take the server down
                failed = self.core.unfinished_request_ids()
                log.exception("engine step failed; ending %d request(s): %s", len(failed), failed)
                self.core.drop_inflight()
                self._fail_all(EngineStepError(f"engine step failed: {exc}"))
                self.last_progress = time.monotonic()
                continue
            self.last_progress = time.monotonic()
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.queue.put_nowait(out)
            if self.deliver_between_steps and outputs:
                await self._until_delivered(loop.time() + _DELIVERY_WAIT_S)

    async def _until_delivered(self, deadline: float) -> None:
        """Yield to the streams until each has taken its outputs and gone on to wait for the
        next (or ``deadline`` passes)."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0)
        while any(s.queue.qsize() for s in self._streams.values()) and loop.time() < deadline:
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # the last ones taken run on to their socket writes

    def _apply_pending(self) -> None:
        aborts, self._pending_aborts = self._pending_aborts, []
        for rid in aborts:
            if rid not in self.core.unfinished_request_ids():
                continue
            self.core.abort(rid)
            stream = self._streams.get(rid)
            if stream is not None:  # aborted from outside: tell the stream it is over
                stream.queue.put_nowait(aborted_output(rid))
        adds, self._pending_adds = self._pending_adds, []
        for rid, prompt, params in adds:
            stream = self._streams.get(rid)
            # The caller left before admission. A cancelled caller's wait is cancelled at once
            # but its clean-up runs one loop turn later, so its stream may still be listed.
            if stream is None or stream.admitted.done():
                continue
            try:
                self.core.add_request(rid, prompt, params)
            except ValueError as exc:
                stream.admitted.set_exception(exc)
                continue
            stream.admitted.set_result(None)

    def _on_loop_end(self, task: asyncio.Task[None]) -> None:
        """The loop ended: cancelled by shutdown, or dead. Either way no stream may wait on."""
        if not task.cancelled() and task.exception() is not None:
            log.error("the engine loop died", exc_info=task.exception())
        error = EngineDeadError("the engine loop stopped")
        for stream in list(self._streams.values()):
            if not stream.admitted.done():
                stream.admitted.set_exception(error)
            stream.queue.put_nowait(error)

    def _failure_from_any_thread(self, error: TensorParallelError) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._die, error)

    def _die(self, error: Exception) -> None:
        """Stop for good: fail every stream without touching the core (the step thread may
        still be inside it), stop the loop, stop the workers, tell the callbacks."""
        if self.fatal_error is not None:
            return
        self.fatal_error = error
        log.error("engine stopped: %s", error)
        failure = EngineStepError(f"engine stopped: {error}")
        for stream in self._streams.values():
            if not stream.admitted.done():
                stream.admitted.set_exception(failure)
            stream.queue.put_nowait(failure)
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self._abandon_core()
        for callback in self._fatal_callbacks:
            callback(error)

    def _abandon_core(self) -> None:
        threading.Thread(target=self.core.shutdown, name="tessel-tp-shutdown", daemon=True).start()

    def _fail_all(self, error: EngineStepError) -> None:
        for rid in self.core.unfinished_request_ids():
            self.core.abort(rid, reason="error")
            stream = self._streams.get(rid)
            if stream is not None:
                stream.queue.put_nowait(error)
