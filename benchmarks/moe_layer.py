"""One Qwen3-30B-A3B MoE layer on the GPU: the fused Triton kernels against the reference loop
and a dense batched GEMM over the same active weights.

Shape: H 2048, expert I 768, 128 experts, top-8, bf16, random weights and softmax routing.
The dense baseline is ``torch.bmm`` over the experts this step activates, each given an equal
share of the T*K rows: the same weight bytes and FLOPs as the MoE with perfect balance and
cuBLAS tiles, i.e. what a grouped GEMM could reach. Bandwidth is the bytes a step must read
(the active experts' weights, plus x and the output) over its time, against H200's 4.8 TB/s
and a device copy measured in the same run. L2 (50 MB, larger than 8 decode experts' weights)
is flushed before every timed run, so decode is not timed out of cache. The Triton path and the
dense baseline are timed as CUDA-graph replays (as the engine runs decode), the reference eagerly
(it reads expert ids back to the host); the Triton path's eager time is shown beside.

    PYTHONPATH=. python benchmarks/moe_layer.py [--out results.md] [--sweep]
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import torch
import triton

from tessel.kernels.moe import reference as ref
from tessel.kernels.moe import triton_moe
from tessel.kernels.moe.configs import MoeConfig, pick_config

H, INTER, E, K = 2048, 768, 128, 8
TOKENS = (1, 16, 64, 256, 1024)
DTYPE = torch.bfloat16
H200_BW = 4.8e12  # bytes/s, HBM3e spec sheet
SWEEP = [MoeConfig(*c) for c in (
    (16, 32, 128, 4, 4), (16, 64, 128, 4, 3), (16, 64, 256, 4, 3), (16, 128, 128, 4, 3),
    (32, 64, 128, 4, 4), (32, 128, 64, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3),
    (64, 128, 64, 8, 4), (128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 256, 64, 8, 3),
)]

_FLUSH = None


def time_ms(fn: Callable[[], object], warmup: int = 10, reps: int = 50, graph: bool = True) -> float:
    """Median milliseconds over CUDA events, one event pair per run, L2 flushed before each.

    ``graph``: time replays of one CUDA graph of ``fn``, as the engine's decode steps run, so
    the host's launch cost of the routing ops and the two kernels is not counted as GPU time.
    """
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    run = fn
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        _FLUSH.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes/s of a 2 GiB device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / (time_ms(lambda: dst.copy_(src), 3, 10, graph=False) * 1e-3)


def make_layer(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    w13 = (torch.randn(E, 2 * INTER, H, device="cuda", generator=g) / H**0.5).to(DTYPE)
    w2 = (torch.randn(E, H, INTER, device="cuda", generator=g) / INTER**0.5).to(DTYPE)
    return w13, w2


def make_step(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, H, device="cuda", generator=g).to(DTYPE)
    weights, ids = ref.route_topk(torch.randn(tokens, E, device="cuda", generator=g), K, True)
    return x, weights, ids


def check(w13: torch.Tensor, w2: torch.Tensor) -> list[str]:
    """Max abs error of the Triton path and the reference in DTYPE against fp32; stop if Triton's is off."""
    lines = []
    w13_f, w2_f = w13.float(), w2.float()
    for tokens in TOKENS:
        x, weights, ids = make_step(tokens, seed=100 + tokens)
        want = ref.fused_moe(x.float(), w13_f, w2_f, weights, ids)
        ref_err = (ref.fused_moe(x, w13, w2, weights, ids).float() - want).abs().max().item()
        errs = {
            path: (triton_moe.fused_moe(x, w13, w2, weights, ids, gemv=path == "gemv").float() - want).abs().max().item()
            for path in (("grouped", "gemv") if tokens <= 4 else ("grouped",))
        }
        shown = ", ".join(f"triton {path} {err:.2e}" for path, err in errs.items())
        lines.append(f"T={tokens}: max abs err vs fp32, {shown}, reference in {DTYPE} {ref_err:.2e}")
        if not max(errs.values()) <= max(3e-2, 2 * ref_err):
            raise SystemExit("Triton fused MoE disagrees with the reference:\n" + "\n".join(lines))
    return lines


def dense_baseline(x: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> Callable[[], object]:
    """Two bmm's over the active experts, T*K rows split evenly (weights gathered untimed)."""
    active = ids.unique()
    rows = triton.cdiv(ids.numel(), active.numel())
    xs = x[torch.arange(rows, device="cuda") % x.shape[0]].expand(active.numel(), rows, H).contiguous()
    w13_t, w2_t = w13[active].transpose(1, 2), w2[active].transpose(1, 2)
    act = torch.randn(active.numel(), rows, INTER, device="cuda").to(DTYPE)

    def run() -> None:
        torch.bmm(xs, w13_t)
        torch.bmm(act, w2_t)

    return run


def step_bytes(tokens: int, active: int) -> int:
    weight = active * 3 * H * INTER * 2
    return weight + 2 * tokens * H * 2  # + x read and output written


def measure(tokens: int, w13: torch.Tensor, w2: torch.Tensor) -> dict[str, float]:
    x, weights, ids = make_step(tokens, seed=tokens)
    active = int(ids.unique().numel())
    return {
        "tokens": tokens,
        "active": active,
        "triton": time_ms(lambda: triton_moe.fused_moe(x, w13, w2, weights, ids, gemv=False)),
        "triton_eager": time_ms(lambda: triton_moe.fused_moe(x, w13, w2, weights, ids, gemv=False), graph=False),
        "gemv": time_ms(lambda: triton_moe.fused_moe(x, w13, w2, weights, ids, gemv=True)) if tokens <= 4 else float("nan"),
        "reference": time_ms(lambda: ref.fused_moe(x, w13, w2, weights, ids), 3, 10, graph=False),
        "dense": time_ms(dense_baseline(x, ids, w13, w2)),
        "bytes": step_bytes(tokens, active),
        "flops": 2 * tokens * K * 3 * H * INTER,
    }


def sweep(tokens: int, w13: torch.Tensor, w2: torch.Tensor) -> str:
    """Every SWEEP config at this T; the line names the fastest (to update configs._TABLE)."""
    x, weights, ids = make_step(tokens, seed=tokens)
    results = []
    for cfg in SWEEP:
        run = functools.partial(triton_moe.fused_moe, x, w13, w2, weights, ids, config=cfg)
        try:
            ms = time_ms(run)
        except Exception as exc:  # out of shared memory or registers: skip the config
            print(f"  T={tokens} {cfg}: {type(exc).__name__}")
            continue
        results.append((ms, cfg))
    ms, best = min(results, key=lambda r: r[0])
    return f"T={tokens}: best {best} {ms:.3f} ms; table's {pick_config(tokens * K, E)}"


def table(rows: list[dict[str, float]], copy_bw: float) -> list[str]:
    out = [
        "| tokens | active experts | triton ms (graph) | GEMV path ms (graph) | triton ms (eager launch) | reference ms | dense bmm ms | triton GB/s | "
        "% of 4.8 TB/s | % of copy | dense GB/s | triton TFLOP/s | vs reference |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bw, dense_bw = r["bytes"] / (r["triton"] * 1e-3), r["bytes"] / (r["dense"] * 1e-3)
        out.append(
            f"| {r['tokens']} | {r['active']} | {r['triton']:.3f} | {r['gemv']:.3f} | {r['triton_eager']:.3f} | {r['reference']:.3f} | {r['dense']:.3f} | "
            f"{bw / 1e9:.0f} | {100 * bw / H200_BW:.0f}% | {100 * bw / copy_bw:.0f}% | {dense_bw / 1e9:.0f} | "
            f"{r['flops'] / (r['triton'] * 1e-3) / 1e12:.1f} | {r['reference'] / r['triton']:.1f}x |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the markdown report here")
    ap.add_argument("--sweep", action="store_true", help="also time every SWEEP tile config")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    w13, w2 = make_layer()
    lines = [f"device: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, "
             f"triton {triton.__version__}",
             f"Qwen3-30B-A3B MoE layer: H {H}, I {INTER}, {E} experts, top-{K}, {DTYPE}"]
    lines += check(w13, w2)
    copy_bw = copy_bandwidth()
    lines.append(f"copy bandwidth (read+write): {copy_bw / 1e12:.2f} TB/s")
    if args.sweep:
        lines += [sweep(t, w13, w2) for t in TOKENS]
    rows = [measure(t, w13, w2) for t in TOKENS]
    lines += ["", *table(rows, copy_bw)]
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
