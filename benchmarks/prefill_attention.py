"""Prefill attention over the paged cache on the GPU: the current kernel against the one before
2026-12-06 (``benchmarks/prefill_variants.py``, switches off) and torch SDPA (flash, cuDNN) where the work is one
contiguous causal prompt. Llama-3.2-1B (head_dim 64) and Llama-3.1-8B (head_dim 128) attention
shapes, 32 query / 8 KV heads, bf16, block size 16, shuffled blocks.

The changes one at a time are timed from ``benchmarks/prefill_variants.py``, a copy of the kernel
with each change behind a switch, at the config the current kernel picked.

Cases: whole prompts (8K, 32K), a chunk of 8K after 96K cached tokens (chunked prefill of a long
prompt, the bulk of issue 5's ablation workload), 16 prompts of 1K, and a mixed step (a 2K chunk
beside 64 decode rows of 1K context). Each kernel autotunes on its first call, the 8K prompt, as
the engine's profiling run does; the "swept" column times every config of the current kernel on
each case to show what that single pick leaves. Baseline and current run twice, alternating.

    PYTHONPATH=. python3 benchmarks/prefill_attention.py [--out prefill.md] [--quick]
"""

from __future__ import annotations

import argparse
import json
import traceback

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.prefill_variants import BEFORE, _before_kernel, variant_prefill
from tessel.kernels.attention import prefill as prefill_mod
from tessel.kernels.attention.metadata import AttentionMetadata

HQ, HKV, PAGE = 32, 8, 16
DTYPE = torch.bfloat16
# name: [(cached context, new tokens)] per request
CASES = {
    "prompt 8K": [(0, 8192)],
    "prompt 32K": [(0, 32768)],
    "8K chunk after 96K": [(98304, 8192)],
    "16 x 1K prompts": [(0, 1024)] * 16,
    "2K chunk + 64 decodes": [(0, 2048)] + [(1023, 1)] * 64,
}


def bench(fn) -> float:  # type: ignore[no-untyped-def]
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def make_case(reqs: list[tuple[int, int]], d: int, seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator(device="cuda").manual_seed(seed)
    seq_lens = [c + n for c, n in reqs]
    blocks = [-(-s // PAGE) for s in seq_lens]
    perm = torch.randperm(sum(blocks), device="cuda", generator=g).to(torch.int32)
    tables = torch.zeros(len(reqs), max(blocks), dtype=torch.int32, device="cuda")
    used = 0
    for b, nb in enumerate(blocks):
        tables[b, :nb] = perm[used : used + nb]
        used += nb
    k_cache = torch.randn(sum(blocks), PAGE, HKV, d, device="cuda", dtype=DTYPE, generator=g)
    v_cache = torch.randn_like(k_cache)
    q_lens = [n for _, n in reqs]
    q = torch.randn(sum(q_lens), HQ, d, device="cuda", dtype=DTYPE, generator=g)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    md = AttentionMetadata(
        slot_mapping=torch.full((q.shape[0],), -1, device="cuda"), query_start_loc=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"), block_tables=tables,
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_size=PAGE,
    )
    pairs = sum(n * c + n * (n + 1) // 2 for c, n in reqs)  # (query, key) pairs the causal mask keeps
    return q, k_cache, v_cache, md, 4 * pairs * d * HQ


def sdpa_rows(q, k_cache, v_cache, md, d: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """SDPA on the same K/V laid out contiguously (one whole prompt only; the gather not timed)."""
    seq = q.shape[0]
    slots = (md.block_tables[0].long()[:, None] * PAGE + torch.arange(PAGE, device="cuda")).flatten()[:seq]
    kc = k_cache.view(-1, HKV, d)[slots].transpose(0, 1)[None].contiguous()
    vc = v_cache.view(-1, HKV, d)[slots].transpose(0, 1)[None].contiguous()
    qc = q.transpose(0, 1)[None]
    out = {}
    for label, backend in [("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)]:
        try:
            with sdpa_kernel(backend):
                out[label] = bench(lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=True))
        except RuntimeError as e:
            print(f"{label}: {str(e).splitlines()[0][:100]}")
    return out


def swept(q, k_cache, v_cache, md, d: int, ref: torch.Tensor) -> tuple[float, str, float]:  # type: ignore[no-untyped-def]
    """Fastest of the current kernel's autotune configs on this case, launched one by one, and
    the largest difference from ``ref`` over all of them (each config's output is checked)."""
    best, worst_diff = (float("inf"), ""), 0.0
    qsl, seq_lens, tables = prefill_mod._device_metadata(md, q.device)
    for cfg in prefill_mod._prefill_kernel.configs:
        m = cfg.kwargs["BLOCK_M"]
        grid = (HKV, triton.cdiv(md.max_query_len * (HQ // HKV), m), md.batch_size)
        out = torch.empty_like(q)

        def run(cfg=cfg, grid=grid, out=out):  # type: ignore[no-untyped-def]
            prefill_mod._prefill_kernel.fn[grid](
                q, k_cache, v_cache, out, qsl, seq_lens, tables, d**-0.5 * prefill_mod.LOG2E,
                q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), tables.stride(0),
                HEAD_DIM=d, GROUP=HQ // HKV, PAGE=PAGE, ROWS=HQ // HKV, DOT_PRECISION="tf32",
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, **cfg.kwargs,
            )
        try:
            run()
            worst_diff = max(worst_diff, (out.float() - ref.float()).abs().max().item())
            ms = bench(run)
        except Exception as e:  # noqa: BLE001 - a config out of shared memory: skip it
            print(f"config {cfg} skipped: {type(e).__name__}")
            continue
        best = min(best, (ms, f"{cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']} w{cfg.num_warps} s{cfg.num_stages}"))
    return best[0], best[1], worst_diff


ON = dict(ACC_IN_DOT=True, FMA_SCALE=True, UNMASKED=True)
VARIANTS = {  # at the current kernel's autotuned config for the head dim
    "before": BEFORE,
    "all, order 0": {**ON, "ORDER": 0},
    "all, order 1": {**ON, "ORDER": 1},
    "all, order 2": {**ON, "ORDER": 2},
    "order 1, no acc-in-dot": {**ON, "ORDER": 1, "ACC_IN_DOT": False},
    "order 1, no FMA scale": {**ON, "ORDER": 1, "FMA_SCALE": False},
    "order 1, masked loads": {**ON, "ORDER": 1, "UNMASKED": False},
}


def measure(model: str, d: int, name: str, sweep: bool) -> dict:  # type: ignore[type-arg]
    q, kc, vc, md, flops = make_case(CASES[name], d)
    scale = d**-0.5
    o1, o2 = torch.empty_like(q), torch.empty_like(q)
    ref = variant_prefill(q, kc, vc, md, scale, torch.empty_like(q)).clone()
    new = prefill_mod.paged_prefill(q, kc, vc, md, scale)
    times: dict[str, list[float]] = {"baseline": [], "current": []}
    for _ in range(2):
        times["baseline"].append(bench(lambda: variant_prefill(q, kc, vc, md, scale, o1)))
        times["current"].append(bench(lambda: prefill_mod.paged_prefill(q, kc, vc, md, scale, o2)))
    base, cur = min(times["baseline"]), min(times["current"])
    row = dict(model=model, case=name, baseline_ms=base, current_ms=cur, speedup=base / cur,
               baseline_tflops=flops / base / 1e9, current_tflops=flops / cur / 1e9,
               max_abs_diff=(new.float() - ref.float()).abs().max().item())
    cfg = prefill_mod._prefill_kernel.best_config
    fixed = (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages)
    row["variants_config"] = str(fixed)
    for label, switches in VARIANTS.items():
        out = variant_prefill(q, kc, vc, md, scale, o1, fixed, **switches)
        row[f"{label} diff"] = (out.float() - ref.float()).abs().max().item()
        row[f"{label} ms"] = bench(lambda sw=switches: variant_prefill(q, kc, vc, md, scale, o1, fixed, **sw))
    if sweep:
        row["swept_ms"], row["swept_config"], row["swept_max_abs_diff"] = swept(q, kc, vc, md, d, ref)
    if len(CASES[name]) == 1 and CASES[name][0][0] == 0:
        row.update({f"{k} tflops": flops / ms / 1e9 for k, ms in sdpa_rows(q, kc, vc, md, d).items()})
    return row


def report(rows: list[dict], out: str | None, json_out: str | None) -> None:  # type: ignore[type-arg]
    picks = {name: {str(k): str(v) for k, v in kernel.cache.items()}
             for name, kernel in [("baseline", _before_kernel), ("current", prefill_mod._prefill_kernel)]}
    lines = ["| model | case | baseline ms (TFLOP/s) | current ms (TFLOP/s) | x baseline | best swept ms (config) "
             "| SDPA flash / cuDNN TFLOP/s | max abs diff (pick / all swept) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sdpa = " / ".join(f"{r[k]:.0f}" for k in ("sdpa flash tflops", "sdpa cudnn tflops") if k in r) or "-"
        sweep = f"{r['swept_ms']:.3f} ({r['swept_config']})" if "swept_ms" in r else "-"
        lines.append(f"| {r['model']} | {r['case']} | {r['baseline_ms']:.3f} ({r['baseline_tflops']:.0f}) | "
                     f"{r['current_ms']:.3f} ({r['current_tflops']:.0f}) | {r['speedup']:.2f} | {sweep} | {sdpa} | "
                     f"{r['max_abs_diff']:.1e} / {r.get('swept_max_abs_diff', float('nan')):.1e} |")
    lines += ["", "Each change on its own: ms at the current kernel's config for the head dim, "
              "and x the kernel before at that config", "",
              "| model | case | config | " + " | ".join(VARIANTS) + " | max abs diff |",
              "|---|---|---|" + "---|" * (len(VARIANTS) + 1)]
    for r in rows:
        before = r["before ms"]
        cells = " | ".join(f"{r[f'{v} ms']:.3f} ({before / r[f'{v} ms']:.2f}x)" for v in VARIANTS)
        diff = max(r[f"{v} diff"] for v in VARIANTS)
        lines.append(f"| {r['model']} | {r['case']} | {r['variants_config']} | {cells} | {diff:.1e} |")
    table = "\n".join(lines)
    print(json.dumps(picks, indent=1))
    print(table)
    if out:
        with open(out, "w") as f:
            f.write(table + "\n\nAutotune picks:\n\n```\n" + json.dumps(picks, indent=1) + "\n```\n")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(dict(rows=rows, picks=picks), f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="the single-request cases only, no sweep")
    args = ap.parse_args()
    names = ["prompt 8K", "prompt 32K", "8K chunk after 96K"] if args.quick else list(CASES)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    rows = []
    for model, d in [("Llama-3.2-1B", 64), ("Llama-3.1-8B", 128)]:
        for name in names:
            try:
                rows.append(measure(model, d, name, sweep=not args.quick))
                print(json.dumps(rows[-1]), flush=True)
            except Exception:  # noqa: BLE001 - one failed case must not lose the others
                traceback.print_exc()
            torch.cuda.empty_cache()
    report(rows, args.out, args.json)


if __name__ == "__main__":
    main()
