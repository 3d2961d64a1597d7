"""What one step's outputs cost to cross the engine process's pipe, at a full batch.

The engine process sends each step's outputs to the server process. The child's side (encode +
pickle) is on the engine loop's critical path; the parent's (unpickle + rebuild) runs beside it.
Before: every output a dataclass copy without prompt and metrics (``dataclasses.replace``),
pickled as dataclasses. Now: ``engine_process.to_wire`` tuples. Both run here on the same data.

    PYTHONPATH=. python3 benchmarks/wire_outputs.py [--batch 256] [--prompt-len 1024]
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.report import emit
from tessel.engine.engine_process import Events, from_wire, to_wire
from tessel.engine.request import CompletionOutput, RequestMetrics, RequestOutput


def lean_before(out: RequestOutput) -> RequestOutput:
    """The encoding before ``to_wire`` (engine_process.lean), kept as the baseline."""
    if out.finished:
        return out
    return dataclasses.replace(out, prompt_token_ids=[], prompt=None, metrics=None)


def step_outputs(batch: int, prompt_len: int) -> list[RequestOutput]:
    metrics = RequestMetrics(0.0, token_times=[float(i) for i in range(64)])
    return [
        RequestOutput(f"cmpl-{i:08x}", list(range(prompt_len)), [CompletionOutput(0, " word", [1234 + i])],
                      False, prompt=None, metrics=metrics)
        for i in range(batch)
    ]


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def dumps(events: Events) -> bytes:
    return pickle.dumps(events, protocol=pickle.HIGHEST_PROTOCOL)


def measure(
    outs: list[RequestOutput], encode: Callable[[RequestOutput], Any], decode: Callable[[Any], RequestOutput],
    repeats: int,
) -> tuple[float, float, int]:
    """ms for the child's side, ms for the parent's side, bytes on the pipe."""
    blob = dumps(Events(outputs=[encode(o) for o in outs]))
    child = best_ms(lambda: dumps(Events(outputs=[encode(o) for o in outs])), repeats)
    parent = best_ms(lambda: [decode(o) for o in pickle.loads(blob).outputs], repeats)
    return child, parent, len(blob)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    outs = step_outputs(args.batch, args.prompt_len)
    rows = [
        ("before (dataclasses)", *measure(outs, lean_before, lambda o: o, args.repeats)),
        ("to_wire tuples", *measure(outs, to_wire, from_wire, args.repeats)),
    ]
    lines = [f"{args.batch} mid-request outputs a step (prompt {args.prompt_len} tokens), median ms of {args.repeats}",
             "", "| encoding | engine process: encode + pickle | server process: unpickle + rebuild | bytes |",
             "|---|---|---|---|"]
    lines += [f"| {n} | {c:.3f} | {p:.3f} | {b} |" for n, c, p, b in rows]
    lines += ["", f"engine process side: {rows[0][1] / rows[1][1]:.1f}x less, server side {rows[0][2] / rows[1][2]:.1f}x less"]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
