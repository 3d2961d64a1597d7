"""The CPU engine's sampler before and after 2026-12-06, side by side in one process.

Before: torch's argmax for greedy rows, and an exponential race (argmax(p / E), E ~ Exp(1) drawn
for every vocabulary entry) for random rows. After: numpy's argmax (``kernels/cpu_argmax.py``) and
one uniform a row against the cumulative mass (``Sampler._inverse_cdf``). The race is still the
CUDA path, so "before" is the same code with the CPU routed back to it.

Two tables: the ops alone on [B, 49152] float32 logits (SmolLM2's vocabulary), then decode steps
of the CPU engine on the default model (median ms per step once every request decodes),
variants alternating per batch size.

    PYTHONPATH=. python3 benchmarks/cpu_sampling.py [--out FILE] [--steps 20]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator

import torch

from benchmarks.report import emit
from tessel.engine import sampler as sampler_mod
from tessel.kernels import dispatch

VOCAB = 49152


@contextlib.contextmanager
def before() -> Iterator[None]:
    """Route the CPU back to torch's argmax and the exponential race."""
    saved = dispatch.argmax_rows, sampler_mod.Sampler._draw
    dispatch.argmax_rows = lambda x: x.argmax(dim=-1)  # type: ignore[assignment]

    def race(self, logits, meta):  # type: ignore[no-untyped-def]
        return self._exponential_race(torch.softmax(logits, dim=-1), meta)

    sampler_mod.Sampler._draw = race  # type: ignore[method-assign]
    try:
        yield
    finally:
        dispatch.argmax_rows, sampler_mod.Sampler._draw = saved  # type: ignore[method-assign]


def best_ms(fn: Callable[[], object], reps: int = 10) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def op_rows(batches: list[int]) -> list[str]:
    from tessel.engine.request import Request
    from tessel.engine.sampling_metadata import SamplingMetadata
    from tessel.engine.sampling_params import SamplingParams

    rows = []
    for b in batches:
        logits = torch.randn(b, VOCAB, generator=torch.Generator().manual_seed(b)) * 3
        reqs = [Request(str(i), [0], SamplingParams(temperature=0.8, max_tokens=8), 8) for i in range(b)]
        meta = SamplingMetadata.build(reqs, VOCAB, "cpu")
        sampler = sampler_mod.Sampler(0)
        timed = {}
        for variant in ("before", "after"):
            with before() if variant == "before" else contextlib.nullcontext():
                timed[f"argmax {variant}"] = best_ms(lambda x=logits: dispatch.argmax_rows(x))
                timed[f"sample {variant}"] = best_ms(lambda x=logits, s=sampler, m=meta: s.sample(x.clone(), m))
        rows.append(f"| {b} | {timed['argmax before']:.3f} | {timed['argmax after']:.3f} | "
                    f"{timed['argmax before'] / timed['argmax after']:.1f}x | {timed['sample before']:.2f} | "
                    f"{timed['sample after']:.2f} | {timed['sample before'] / timed['sample after']:.1f}x |")
    return rows


def decode_step_ms(llm, batch: int, temperature: float, steps: int) -> float:  # type: ignore[no-untyped-def]
    from tessel.engine import SamplingParams

    core, rng = llm.core, random.Random(batch)
    for i in range(batch):
        params = SamplingParams(temperature=temperature, max_tokens=steps + 4, ignore_eos=True)
        core.add_request(f"{batch}-{temperature}-{i}-{time.monotonic_ns()}", [rng.randint(10, 40000) for _ in range(32)], params)
    core.step()  # the prefill
    times = []
    while core.has_unfinished():
        t = time.perf_counter()
        core.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:steps]) * 1e3


def engine_rows(batches: list[int], steps: int) -> list[str]:
    from tessel.engine import LLM

    llm = LLM(max_num_seqs=max(batches), max_model_len=256)
    rows = []
    for temperature in (0.0, 0.8):
        for b in batches:
            timed = {}
            for variant in ("before", "after", "before again", "after again"):
                with before() if variant.startswith("before") else contextlib.nullcontext():
                    timed[variant] = decode_step_ms(llm, b, temperature, steps)
            old, new = min(timed["before"], timed["before again"]), min(timed["after"], timed["after again"])
            rows.append(f"| {temperature} | {b} | {old:.1f} | {new:.1f} | {old / new:.2f}x |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads", "",
             f"Ops on [B, {VOCAB}] float32 logits, best of 10 (ms); sample = the whole CPU sampler at temperature 0.8:", "",
             "| B | argmax before | argmax after | x | sample before | sample after | x |", "|---|---|---|---|---|---|---|",
             *op_rows([*args.batches, 256]), "",
             f"CPU engine, default model, 32-token prompts, median decode step over {args.steps} steps (ms), best of two runs a variant:", "",
             "| temperature | batch | before | after | x |", "|---|---|---|---|---|",
             *engine_rows(args.batches, args.steps)]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
