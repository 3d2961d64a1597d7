"""One HTTP request's trip through the engine: one engine request per prompt, merged.

Owns what must happen however the response ends: the admission ticket is closed, requests
still running are aborted (their KV blocks freed), and each finished engine request is
recorded in the metrics with its finish reasons. A failed engine step or a passed deadline
ends the generation with ``GenerationFailed``, which says what the client is told.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from tessel.engine.async_engine import EngineDeadError, EngineStepError
from tessel.engine.request import RequestOutput
from tessel.engine.sampling_params import SamplingParams
from tessel.server.protocol.errors import APIError
from tessel.server.state import Ticket

if TYPE_CHECKING:
    from tessel.engine import AsyncEngine
    from tessel.server.metrics import ServerMetrics


class GenerationFailed(APIError):
    """The engine could not finish the request; its open choices end with ``finish_reason``."""

    def __init__(self, status: int, message: str, code: str, finish_reason: str) -> None:
        super().__init__(status, message, code=code)
        self.finish_reason = finish_reason


def engine_failure(err: Exception) -> GenerationFailed:
    return GenerationFailed(500, f"the engine failed this request: {err}", "engine_error", "error")


def timed_out(timeout_s: float) -> GenerationFailed:
    return GenerationFailed(
        408, f"the request timed out after {timeout_s:g} s", "request_timeout", "abort"
    )


@dataclass
class PromptRun:
    """Book-keeping of one prompt's engine request."""

    request_id: str
    prompt_token_ids: list[int]
    num_generated: int = 0
    reasons: dict[int, str] = field(default_factory=dict)  # choice index -> finish reason
    finished: bool = False


class Generation:
    """Runs ``prompts`` through the engine and yields ``(prompt index, delta)`` pairs.

    Iterate it once, inside ``async with``; leaving the block early (client gone, error)
    aborts every engine request that has not finished.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        metrics: ServerMetrics,
        ticket: Ticket,
        request_id: str,
        prompts: list[list[int]],
        params: SamplingParams,
        timeout_s: float | None = None,
    ) -> None:
        self.engine = engine
        self.request_id = request_id
        self.metrics = metrics
        self.ticket = ticket
        self.params = params
        self.prompts = prompts
        self.runs = [
            PromptRun(request_id if len(prompts) == 1 else f"{request_id}-{i}", ids)
            for i, ids in enumerate(prompts)
        ]
        self.timeout_s = timeout_s
        loop = asyncio.get_running_loop()
        self.deadline = None if timeout_s is None else loop.time() + timeout_s
        self.started_at = time.monotonic()
        self._failed = False

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, GenerationFailed):
            reason = exc.finish_reason
        elif exc is not None and not isinstance(exc, asyncio.CancelledError | GeneratorExit):
            reason = "error"
        else:
            reason = "error" if self._failed else "abort"
        await self.close(reason=reason)

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        streams = [
            self.engine.generate(run.prompt_token_ids, self.params, run.request_id)
            for run in self.runs
        ]
        merged = _tagged(streams[0]) if len(streams) == 1 else _merge(streams)
        try:
            while True:
                try:
                    async with asyncio.timeout_at(self.deadline):  # not across the yield
                        prompt_index, output = await anext(merged)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    assert self.timeout_s is not None
                    raise timed_out(self.timeout_s) from None
                except (EngineStepError, EngineDeadError) as err:
                    raise engine_failure(err) from err
                self._account(prompt_index, output)
                yield prompt_index, output
        except Exception:
            self._failed = True
            raise
        finally:
            # Shielded: a cancelled client task must still close (and so abort) its streams.
            with anyio.CancelScope(shield=True):
                await merged.aclose()
                for stream in streams:
                    await stream.aclose()  # type: ignore[attr-defined]

    def _account(self, prompt_index: int, output: RequestOutput) -> None:
        self.ticket.started()
        run = self.runs[prompt_index]
        for choice in output.outputs:
            run.num_generated += len(choice.token_ids)
            if choice.finish_reason is not None:
                run.reasons[choice.index] = choice.finish_reason
        if output.finished and not run.finished:
            run.finished = True
            for index in range(self.params.n):
                run.reasons.setdefault(index, "length")
            self._record(run, output)

    def _record(self, run: PromptRun, last: RequestOutput | None) -> None:
        reasons = [run.reasons.get(i, "abort") for i in range(self.params.n)]
        metrics = last.metrics if last is not None else None
        self.metrics.observe_request(metrics, len(run.prompt_token_ids), run.num_generated, reasons)

    async def close(self, reason: str = "abort") -> None:
        """Abort what still runs (recording ``reason`` for its choices) and release the ticket."""
        try:
            for run in self.runs:
                if run.finished:
                    continue
                run.finished = True
                with anyio.CancelScope(shield=True):
                    await self.engine.abort(run.request_id)
                for index in range(self.params.n):
                    run.reasons.setdefault(index, reason)
                self._record(run, None)
        finally:
            self.ticket.close()


async def _tagged(
    stream: AsyncIterator[RequestOutput],
) -> AsyncGenerator[tuple[int, RequestOutput]]:
    async for output in stream:
        yield 0, output


async def _merge(
    streams: list[AsyncIterator[RequestOutput]],
) -> AsyncGenerator[tuple[int, RequestOutput]]:
    """Interleave several engine streams as their outputs arrive."""
    queue: asyncio.Queue[tuple[int, RequestOutput] | BaseException | None] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in stream:
                await queue.put((index, output))
            await queue.put(None)
        except Exception as err:  # handed to the consumer, which re-raises it
            await queue.put(err)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
