"""The engine core in a process of its own: the child's side.

In one process the HTTP event loop and the engine's step thread share one GIL, and at a few
hundred streams the loop's per-token Python (~25-40 us a chunk) keeps the steps' own Python
waiting: an H200 serving Llama-3.1-8B idled 7-12 s of a ~28 s run, against 1.1 s for the
same requests offline. Here the core runs in a child with its own interpreter; the parent
(``process_engine.py``) keeps the streams.

Two one-way pipes. Commands go down (add, abort, fault, shutdown); a reader thread moves them
into a queue, so the parent's sends never wait for a step to end. Events come up after every
step, and after commands that change anything: the outputs (mid-request as plain tuples
without the prompt ids and metrics, see ``to_wire``), which adds were admitted or refused, the stats.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from tessel.config.settings import EngineConfig
from tessel.engine.request import CompletionOutput, RequestOutput
from tessel.engine.stats import EngineStats

if TYPE_CHECKING:
    from tessel.engine.core import EngineCore

log = logging.getLogger("tessel.engine")


@dataclass
class EngineInfo:
    """What the parent needs to know of the model, sent once it is loaded."""

    tokenizer: Any
    served_name: str
    max_model_len: int
    vocab_size: int


@dataclass
class Events:
    """One message up: what happened since the last one."""

    outputs: list[WireOutput] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (request id, the ValueError's text)
    aborted: list[str] = field(default_factory=list)  # unfinished requests an abort command ended
    failed: tuple[list[str], str] | None = None  # a step raised: its requests, the error
    stats: EngineStats | None = None
    busy: bool = False  # requests are unfinished: the parent's watchdog may expect progress


# A mid-request output as (request id, choices as CompletionOutput field tuples, prompt logprobs,
# cached tokens). Pickling 256 RequestOutput/CompletionOutput dataclasses cost the engine process
# ~1.4 ms a step against ~0.25 ms for these tuples, and the engine's loop is what the GPU waits on.
# A finished output goes whole (once per request): the parent reads its prompt and metrics.
WireOutput = RequestOutput | tuple[str, list[tuple[Any, ...]], Any, int]


def to_wire(out: RequestOutput) -> WireOutput:
    if out.finished:
        return out
    choices = [(c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason, c.logprobs) for c in out.outputs]
    return out.request_id, choices, out.prompt_logprobs, out.num_cached_tokens


def from_wire(item: WireOutput) -> RequestOutput:
    """The parent's side: a mid-request output comes back without prompt ids, prompt or metrics,
    which the streams read only once a request has finished."""
    if isinstance(item, RequestOutput):
        return item
    request_id, choices, prompt_logprobs, num_cached = item
    outputs = [CompletionOutput(*c) for c in choices]
    return RequestOutput(request_id, [], outputs, False, None, prompt_logprobs, num_cached)


def run_engine_process(config: EngineConfig, commands: Connection, events: Connection) -> None:
    """The child's main: load, say ready (or why not), then serve commands and step."""
    from tessel.engine.core import EngineCore  # torch and the model: only in the child
    from tessel.engine.engine_setup import build_engine_parts

    # The parent decides when this process ends (a shutdown command, or its pipe closing): a
    # Ctrl-C in a terminal reaches the whole group and must not end it in the middle of a
    # drain. SIGTERM keeps its default: it is what multiprocessing stops a daemon child with.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s [engine] %(message)s")
    try:
        core = EngineCore(build_engine_parts(config))
    except BaseException as exc:  # the parent raises it as a load failure
        events.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    parts = core.parts
    events.send(("ready", EngineInfo(core.tokenizer, parts.served_name, core.max_model_len, parts.vocab_size)))
    events.send(("events", Events(stats=core.stats())))
    inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
    threading.Thread(target=_read_commands, args=(commands, inbox), name="tessel-commands", daemon=True).start()
    try:
        _serve(core, inbox, events)
    finally:
        core.shutdown()


def _read_commands(commands: Connection, inbox: queue.Queue[tuple[Any, ...]]) -> None:
    try:
        while True:
            inbox.put(commands.recv())
    except (EOFError, OSError):  # the parent went away: stop as if told to
        inbox.put(("shutdown",))


def _serve(core: EngineCore, inbox: queue.Queue[tuple[Any, ...]], events: Connection) -> None:
    while True:
        # Idle: wait for a command. Busy: take what has come in, then step.
        pending = [inbox.get()] if not core.has_unfinished() else []
        while True:
            try:
                pending.append(inbox.get_nowait())
            except queue.Empty:
                break
        out = Events()
        for command in pending:
            if command[0] == "shutdown":
                return
            _apply(core, command, out)
        if core.has_unfinished():
            try:
                out.outputs = [to_wire(o) for o in core.step()]
            except Exception as exc:  # one failed step ends its requests, not the engine
                failed = core.unfinished_request_ids()
                log.exception("engine step failed; ending %d request(s)", len(failed))
                core.drop_inflight()
                for rid in failed:
                    core.abort(rid, reason="error")
                out.failed = (failed, f"engine step failed: {exc}")
        out.stats = core.stats()
        out.busy = core.has_unfinished()
        events.send(("events", out))


def _apply(core: EngineCore, command: tuple[Any, ...], out: Events) -> None:
    kind = command[0]
    if kind == "add":
        _, rid, prompt, params = command
        try:
            core.add_request(rid, prompt, params)
        except ValueError as exc:
            out.refused.append((rid, str(exc)))
        else:
            out.admitted.append(rid)
    elif kind == "abort":
        if command[1] in core.unfinished_request_ids():
            core.abort(command[1])
            out.aborted.append(command[1])
    elif kind == "fault":
        core.faults.inject(command[1], command[2])
