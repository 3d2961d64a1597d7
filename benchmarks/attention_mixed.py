"""Attention in mixed steps on the GPU: decode rows and prefill chunks in one batch.

In a mixed step every row goes through the prefill kernel. ``benchmarks/step_profile.py`` found
that kernel at 32% of the GPU time of Llama-3.1-8B's mixed steps under the online load. Three
ways to run the same batch, side by side (Llama-3.1-8B attention: 32 query heads, 8 KV heads,
head_dim 128, bf16, block 16; decode requests first, as the scheduler orders them):

- per query head: the prefill kernel, one program per (row block, request, query head);
- GQA-packed: the prefill kernel with a KV head's query heads packed into the tile's rows, so each
  context is read once per KV head (``paged_prefill(..., pack_gqa=True)``);
- split: the balanced split-KV decode kernel on the decode rows, then the prefill kernel on the rest.

    PYTHONPATH=. python benchmarks/attention_mixed.py [--out results.md]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/attention_mixed.py --smoke   # CPU: tiny cases, no timing
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np
import torch
import triton

from benchmarks.report import emit
from tessel.kernels.attention.decode import DecodeConfig, build_decode_plan, paged_decode
from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.attention.prefill import paged_prefill

HQ, HKV, D, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16
SCALE = D**-0.5
DEVICE = "cuda"


def cases(smoke: bool) -> dict[str, tuple[list[int], list[tuple[int, int]]]]:
    """name -> (decode contexts, [(new tokens, context after them)] of the prefills)."""
    rng = np.random.default_rng(0)
    if smoke:
        return {"3 decode + one 20-token prefill": (rng.integers(5, 60, 3).tolist(), [(20, 37)])}
    dec256 = rng.integers(100, 1000, 256).tolist()
    dec64 = rng.integers(100, 1000, 64).tolist()
    return {
        "256 decode + one 340-token prefill": (dec256, [(340, 340)]),
        "256 decode + one 1792-token chunk": (dec256, [(1792, 1792)]),
        "64 decode + 8 prefills of 200": (dec64, [(200, 200)] * 8),
        "256 decode + chunk 512 of a 4K prompt": (dec256, [(512, 4096)]),
        "prefill 2048 alone": ([], [(2048, 2048)]),
    }


def build(decode_ctx: list[int], prefills: list[tuple[int, int]]) -> tuple[torch.Tensor, ...]:
    q_lens = [1] * len(decode_ctx) + [n for n, _ in prefills]
    seq_lens = decode_ctx + [c for _, c in prefills]
    blocks = [-(-s // PAGE) for s in seq_lens]
    g = torch.Generator(device=DEVICE).manual_seed(0)
    k_cache = torch.randn(sum(blocks), PAGE, HKV, D, device=DEVICE, dtype=DTYPE, generator=g)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(sum(blocks), device=DEVICE, generator=g).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32, device=DEVICE)
    start = 0
    for b, nb in enumerate(blocks):
        tables[b, :nb] = perm[start : start + nb]
        start += nb
    q = torch.randn(sum(q_lens), HQ, D, device=DEVICE, dtype=DTYPE, generator=g)
    return q, k_cache, v_cache, tables, torch.tensor(q_lens), torch.tensor(seq_lens, dtype=torch.int32)


def metadata(q_lens: torch.Tensor, seq_lens: torch.Tensor, tables: torch.Tensor) -> AttentionMetadata:
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.full((int(qsl[-1]),), -1, dtype=torch.int64, device=DEVICE),
        query_start_loc=qsl.to(DEVICE), seq_lens=seq_lens.to(DEVICE), block_tables=tables,
        max_query_len=int(q_lens.max()), max_seq_len=int(seq_lens.max()), block_size=PAGE,
        seq_lens_cpu=seq_lens,
    )


def variants(decode_ctx: list[int], batch: tuple[torch.Tensor, ...]) -> dict[str, Callable[[], torch.Tensor]]:
    q, kc, vc, tables, q_lens, seq_lens = batch
    md = metadata(q_lens, seq_lens, tables)
    run: dict[str, Callable[[], torch.Tensor]] = {
        "per query head": lambda: paged_prefill(q, kc, vc, md, SCALE, pack_gqa=False),
        "GQA-packed": lambda: paged_prefill(q, kc, vc, md, SCALE, pack_gqa=True),
    }
    nd = len(decode_ctx)
    if nd and nd < len(q_lens):
        plan = build_decode_plan(seq_lens[:nd], HQ, HKV, D, q.device, DecodeConfig())
        md_pre = metadata(q_lens[nd:], seq_lens[nd:], tables[nd:])
        out = torch.empty_like(q)

        def split() -> torch.Tensor:
            paged_decode(q[:nd], kc, vc, tables[:nd], plan, SCALE, out[:nd])
            paged_prefill(q[nd:], kc, vc, md_pre, SCALE, out[nd:], pack_gqa=False)
            return out

        run["split: decode + prefill kernels"] = split
    return run


def timed_ms(fn: Callable[[], torch.Tensor]) -> float:
    if DEVICE == "cpu":  # the smoke run: one interpreted call, not a measurement
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main() -> None:
    global DEVICE, DTYPE
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny cases on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.smoke:
        assert os.environ.get("TRITON_INTERPRET") == "1", "--smoke runs Triton's interpreter"
        DEVICE, DTYPE = "cpu", torch.float32
    names = ["per query head", "GQA-packed", "split: decode + prefill kernels"]
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreter)"
    lines = [f"device: {device}; torch {torch.__version__}, triton {triton.__version__}; "
             f"{HQ} q heads, {HKV} KV heads, head_dim {D}, {DTYPE}, block {PAGE}", "",
             "| case | KV MB read once | " + " | ".join(f"{n} ms" for n in names) + " | best vs per query head | max abs diff |",
             "|---|---:|" + "---:|" * len(names) + "---:|---:|"]
    for name, (decode_ctx, prefills) in cases(args.smoke).items():
        batch = build(decode_ctx, prefills)
        kv_mb = int(batch[5].sum()) * HKV * D * 2 * batch[1].element_size() / 1e6
        runs = variants(decode_ctx, batch)
        want = runs["per query head"]().float()
        diff = max((fn().float() - want).abs().max().item() for fn in runs.values())
        ms = {n: timed_ms(fn) for n, fn in runs.items()}
        cells = [f"{ms[n]:.3f}" if n in ms else "" for n in names]
        best = min(ms.values())
        lines.append(f"| {name} | {kv_mb:.0f} | " + " | ".join(cells) + f" | {ms['per query head'] / best:.2f}x | {diff:.1e} |")
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
