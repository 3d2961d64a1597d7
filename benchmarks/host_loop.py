"""The engine's host loop at a full batch: what a step costs the CPU outside the model.

A tiny random-weight model (``tiny_model.py``) keeps the forward short, so the table isolates
the Python around it: scheduling, stage 1 (prepare), recording the step's tokens, stage 5
(detokenize, stop checks, outputs), the offline ``LLM.generate`` loop folding the outputs, and
the rest of the step outside the model's stages (``host`` is the step's wall time less the copy,
compute and sampling stages). Random ids and the presets' placeholder tokenizer, as the GPU
benchmarks use.
On a GPU those parts are what a large batch of a small model waits on (``quant_h200.md``: ~9 ms
a step at 256 requests against 7.8 ms of GPU work).

``--baseline REF`` runs the same measurement on a git worktree of REF in the same run,
alternating with the working tree, and prints the ratio (``--baseline-dir`` takes a tree
already extracted, e.g. by ``git archive``, where there is no git history).

On a GPU, ``--model`` names a preset (random bf16 weights drawn on the GPU). The copy, compute
and sampling stages are then device times that overlap the host's work, so ``host`` is not
meaningful there; ``step`` is, when the model is small enough for the host to set the pace.

    PYTHONPATH=. python3 benchmarks/host_loop.py [--batch 256] [--prompt-len 512] [--baseline HEAD~1]
    PYTHONPATH=. python3 benchmarks/host_loop.py --model Llama-3.2-1B --prompt-len 1024 --baseline-dir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import emit

PARTS = ("schedule", "prepare", "update", "return", "caller", "other")
MODEL_STAGES = ("copy", "compute", "aggregate")  # the model's work and sampling: not host loop
ROOT = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> dict[str, float]:
    """Host ms per step by part, median over ``--repeats`` timed generations. Tessel comes from
    ``--tree``; this script's helpers (``benchmarks``, already imported) from this checkout."""
    sys.path.insert(0, args.tree)
    import torch

    import tessel
    from benchmarks.step_trace import timed_calls
    from tessel.engine import LLM, SamplingParams

    if not Path(tessel.__file__).resolve().is_relative_to(Path(args.tree).resolve()):
        raise RuntimeError(f"Tessel came from {tessel.__file__}, not from {args.tree}")

    cuda = torch.cuda.is_available()
    if cuda:
        from benchmarks.decode_roofline import use_gpu_dummy_weights

        use_gpu_dummy_weights()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    llm = LLM(args.model, load_format="dummy", max_num_seqs=args.batch,
              max_model_len=args.prompt_len + args.output_len + 16,
              max_num_batched_tokens=min(args.batch * args.prompt_len, 16384))
    prompts = [[3 + (i * 31 + j) % 9000 for j in range(args.prompt_len)] for i in range(args.batch)]
    params = SamplingParams(temperature=0.6, seed=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:8], SamplingParams(max_tokens=4))
    core = llm.core
    targets = {"schedule": (core.scheduler, "schedule"), "update": (core.scheduler, "update_from_output"),
               "step": (core, "step")}
    runs: dict[str, list[float]] = {p: [] for p in (*PARTS, "host", "step")}
    for _ in range(args.repeats):
        stats = core.step_stats
        stages0, steps0 = dict(stats.stage_seconds), stats.steps
        sync()
        with timed_calls(targets) as seconds:
            t = time.perf_counter()
            llm.generate(prompts, params)
            sync()
            wall = time.perf_counter() - t
        steps = stats.steps - steps0
        stage = {k: v - stages0.get(k, 0.0) for k, v in stats.stage_seconds.items()}
        part = {
            "schedule": seconds["schedule"], "prepare": stage.get("prepare", 0.0),
            "update": seconds["update"], "return": stage.get("return", 0.0),
            "caller": wall - seconds["step"],
        }
        host = wall - sum(stage.get(name, 0.0) for name in MODEL_STAGES)
        part["other"] = host - sum(part.values())  # the rest of a step's Python: launch, checks
        for name, sec in part.items():
            runs[name].append(sec / steps * 1e3)
        runs["host"].append(host / steps * 1e3)
        runs["step"].append(wall / steps * 1e3)
    return {name: statistics.median(v) for name, v in runs.items()}


def measure(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    """One child process importing Tessel from ``tree``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree), "--model", args.model,
           "--batch", str(args.batch),
           "--prompt-len", str(args.prompt_len), "--output-len", str(args.output_len),
           "--repeats", str(args.repeats)]
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child failed in {tree}:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed generations per process")
    ap.add_argument("--rounds", type=int, default=2, help="processes per tree, alternating")
    ap.add_argument("--baseline", default=None, help="a git ref to compare against")
    ap.add_argument("--baseline-dir", default=None, help="a tree to compare against")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=str(ROOT), help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help="a preset (default: a tiny random model)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    from benchmarks.tiny_model import write_tiny_model  # imports Tessel: not in a child

    args.model = args.model or str(write_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-"))))
    trees = {"working tree": ROOT}
    if args.baseline_dir:
        trees = {f"baseline {args.baseline_dir}": Path(args.baseline_dir).resolve(), **trees}
    elif args.baseline:
        base = Path(tempfile.mkdtemp(prefix="tessel-base-")) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline],
                       check=True, capture_output=True)
        trees = {f"baseline {args.baseline}": base, **trees}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        for _ in range(args.rounds):
            for name, tree in trees.items():
                results[name].append(measure(tree, args))
    finally:
        if args.baseline:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False, capture_output=True)
    cols = (*PARTS, "host", "step")
    lines = [
        f"{Path(args.model).name}, batch {args.batch}, prompt {args.prompt_len}, output {args.output_len}; ms per step, "
        f"median of {args.repeats} generations, one row per process",
        "",
        "| tree | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for name, rows in results.items():
        lines += [f"| {name} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |" for r in rows]
    lines.append("")
    if len(results) == 2:
        for col in ("host", "step"):
            old, new = (statistics.median(r[col] for r in rows) for rows in results.values())
            lines.append(f"{col}, baseline / working tree: {old / new:.2f}x ({old:.2f} -> {new:.2f} ms per step)")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
