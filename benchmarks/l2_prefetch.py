"""Does a weight read into L2 beforehand make the batch-1 GEMV that follows faster? (issue 5)

For each Llama-3.1-8B / 3.2-1B decode GEMV weight: the prefetch kernel's own bandwidth, and the
GEMV's time cold (L2 flushed by a 256 MB read) against right after ``l2_prefetch`` of its first
``MB`` (timed with events around the GEMV alone, median of 50).

    PYTHONPATH=. python3 benchmarks/l2_prefetch.py
"""

from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl

WORD_BLOCK = 8192  # int32 words per program: 32 KB in flight, enough to keep device memory busy


@triton.jit
def _l2_prefetch_kernel(src, n_words, sink, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    # evict_last: stay in L2 past the streaming loads that follow (ptxas refuses it with .cg)
    words = tl.load(src + offs, mask=offs < n_words, other=0, eviction_policy="evict_last")
    # stored so the loads are not dead code; one word a program
    tl.store(sink + pid, tl.sum(words, axis=0))


def l2_prefetch(t: torch.Tensor, max_bytes: int, sink: torch.Tensor) -> None:
    """Read the first ``max_bytes`` of ``t`` (contiguous, CUDA) through L2; ``sink`` is an int32
    scratch tensor of at least ``prefetch_programs(max_bytes)`` words."""
    words = t.reshape(-1).view(torch.uint8)[: min(max_bytes, t.numel() * t.element_size()) // 4 * 4].view(torch.int32)
    grid = triton.cdiv(words.numel(), WORD_BLOCK)
    if grid:
        _l2_prefetch_kernel[(grid,)](words, words.numel(), sink, BLOCK=WORD_BLOCK, num_warps=8)


def prefetch_programs(max_bytes: int) -> int:
    return triton.cdiv(max_bytes // 4, WORD_BLOCK)


SHAPES = {  # (out, in) of the GEMV
    "8B o_proj": (4096, 4096), "8B qkv_proj": (6144, 4096), "8B gate_up": (28672, 4096),
    "1B o_proj": (2048, 2048), "1B qkv_proj": (3072, 2048), "1B gate_up": (16384, 2048),
}


def timed(fn, before, reps: int = 50) -> float:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(reps):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return statistics.median(out)


def main() -> None:
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    sink = torch.empty(prefetch_programs(64 << 20) + 64, dtype=torch.int32, device="cuda")
    print("| weight | MB | prefetch us (GB/s) | GEMV cold us | after prefetch of MB: us |")
    print("|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / 64
        x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
        mb = w.numel() * 2 / 2**20
        def cold() -> None:
            flush.add_(1)
        def gemv(x: torch.Tensor = x, w: torch.Tensor = w) -> None:
            torch.nn.functional.linear(x, w)
        pre = timed(lambda w=w: l2_prefetch(w, 64 << 20, sink), cold)
        gemv_cold = timed(gemv, cold)
        cells = []
        for take in (8, 16, 32, 48):
            if take > mb + 1 and take != 8:
                continue
            def warm(take: int = take, w: torch.Tensor = w) -> None:
                cold()
                l2_prefetch(w, take << 20, sink)
            cells.append(f"{take}: {timed(gemv, warm):.1f}")
        pre_bytes = min(mb, 64) * 2**20
        print(f"| {name} | {mb:.0f} | {pre:.1f} ({pre_bytes / pre / 1e3:.0f}) | {gemv_cold:.1f} | {'; '.join(cells)} |",
              flush=True)


if __name__ == "__main__":
    main()
