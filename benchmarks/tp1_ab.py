"""TP=1 A/B on the CPU: the default model, 16 greedy prompts x 32 tokens, from the tree given.
Run it alternately on a checkout from before tensor parallelism and on this one:

    PYTHONPATH=TREE python benchmarks/tp1_ab.py TREE [--threads N]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing".split()  # noqa: SIM905


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tree", help="the checkout to import the engine from")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    sys.path.insert(0, args.tree)
    import torch

    from tessel import engine
    from tessel.engine import LLM, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(16, 64))) for _ in range(16)]
    llm = LLM()
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    start, cpu = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"{engine.__file__}: {tokens / wall:.1f} output tok/s ({wall:.2f} s wall, {cpu:.2f} s CPU)")


if __name__ == "__main__":
    main()
