"""Decode and prefill attention on the GPU: our Triton kernels against torch SDPA.

Llama-3.1-8B attention shape (32 q heads, 8 KV heads, head_dim 128), bf16 KV, block size 16.
Decode: balanced split-KV, static split (FlashDecoding), no split, and SDPA flash / cuDNN on
KV gathered to contiguous padded tensors (the gather itself is not timed). Bandwidth is KV
bytes read over time, against a device-to-device copy measured in the same run. Decode times
are CUDA-graph replays, as the engine runs decode; the eager column adds each call's launch.

    PYTHONPATH=. python benchmarks/attention.py [--out results.md] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tessel.kernels.attention import decode as decode_mod
from tessel.kernels.attention import prefill as prefill_mod
from tessel.kernels.attention.decode import DecodeConfig, build_decode_plan, paged_decode
from tessel.kernels.attention.metadata import AttentionMetadata
from tessel.kernels.attention.plan import default_num_buckets, plan_decode_tiles

HQ, HKV, D, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16
PADDED_CHUNK_BYTES = 12 << 30  # padded SDPA runs in batch chunks of at most this much K+V


def bench(fn) -> float:  # type: ignore[no-untyped-def]
    """Median milliseconds over device events, each call launched from Python."""
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def bench_graph(fn) -> float:  # type: ignore[no-untyped-def]
    """Median milliseconds of ``fn`` replayed from a CUDA graph, as the engine runs decode.

    Timed eagerly, a call also counts its Python launch while the GPU waits: about 11 us more
    for our autotuned launch on the H200 (2026-12-04), 8% of a 1 x 128K decode."""
    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def copy_bandwidth() -> float:
    """Bytes/s of a 2 GiB device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * src.numel() * 2 / (ms * 1e-3)


@dataclass
class Batch:
    lens: np.ndarray
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    tables: torch.Tensor

    @property
    def kv_bytes(self) -> int:
        return int(self.lens.sum()) * HKV * D * 2 * self.k_cache.element_size()


def make_decode_batch(lens: np.ndarray, seed: int = 0) -> Batch:
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks = -(-lens // PAGE)
    num_blocks = int(blocks.sum())
    shape = (num_blocks, PAGE, HKV, D)
    k_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=g)
    v_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=g)
    perm = torch.randperm(num_blocks, device="cuda", generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), int(blocks.max()), dtype=torch.int32, device="cuda")
    start = 0
    for b, nb in enumerate(blocks.tolist()):
        tables[b, :nb] = perm[start : start + nb]
        start += nb
    q = torch.randn(len(lens), HQ, D, device="cuda", dtype=DTYPE, generator=g)
    return Batch(lens, q, k_cache, v_cache, tables)


def padded_sdpa_ms(batch: Batch, backend: SDPBackend) -> tuple[tuple[float, float], str]:
    """SDPA over K/V gathered into [B, H, max_len, D], chunked by batch; returns (ms, how).

    Tries GQA-native with the padding masked, then unmasked (flash takes no mask: same work,
    padded rows' outputs wrong), then K/V expanded to the q heads. ms = (graph, eager).
    """
    for expand, masked in [(False, True), (False, False), (True, False)]:
        try:
            return _padded_sdpa_ms(batch, backend, expand, masked), (
                ("masked" if masked else "unmasked") + (", KV expanded to 32 heads" if expand else ""))
        except RuntimeError:
            torch.cuda.empty_cache()
    raise RuntimeError("no variant ran")


def _padded_sdpa_ms(batch: Batch, backend: SDPBackend, expand: bool, masked: bool) -> tuple[float, float]:
    max_len = int(batch.lens.max())
    heads = HQ if expand else HKV
    per_req = 2 * heads * max_len * D * 2
    chunk = max(1, PADDED_CHUNK_BYTES // per_req)
    total = eager = 0.0
    for b0 in range(0, len(batch.lens), chunk):
        b1 = min(len(batch.lens), b0 + chunk)
        k = torch.randn(b1 - b0, heads, max_len, D, device="cuda", dtype=DTYPE)
        v = torch.randn_like(k)
        q = batch.q[b0:b1].unsqueeze(2)  # [b, Hq, 1, D]
        lens = torch.as_tensor(batch.lens[b0:b1], device="cuda")
        mask = (torch.arange(max_len, device="cuda")[None, :] < lens[:, None])[:, None, None, :]
        with sdpa_kernel(backend):
            fn = functools.partial(F.scaled_dot_product_attention, q, k, v,
                                   attn_mask=mask if masked else None, enable_gqa=not expand)
            fn()
            total += bench_graph(fn)
            eager += bench(fn)
        del k, v, fn
    return total, eager


def decode_rows(name: str, lens: np.ndarray, copy_bw: float, sms: int) -> list[dict[str, Any]]:
    batch = make_decode_batch(lens)
    rows: list[dict[str, Any]] = []
    scale = D**-0.5
    for label, cfg in [
        ("balanced", DecodeConfig()),
        ("static split", DecodeConfig(mode="static")),
        ("no split", DecodeConfig(mode="none")),
    ]:
        plan = build_decode_plan(lens, HQ, HKV, D, torch.device("cuda"), cfg)
        out = torch.empty_like(batch.q)
        fn = functools.partial(paged_decode, batch.q, batch.k_cache, batch.v_cache, batch.tables, plan, scale, out)
        fn()
        ms = bench_graph(fn)
        rows.append(dict(case=name, variant=label, ms=ms, eager_ms=bench(fn), imbalance=plan.host.imbalance(),
                         tiles=plan.host.num_tiles, programs=plan.host.num_buckets * HKV))
    for label, backend in [("sdpa flash (padded)", SDPBackend.FLASH_ATTENTION),
                           ("sdpa cudnn (padded)", SDPBackend.CUDNN_ATTENTION)]:
        try:
            (ms, eager_ms), how = padded_sdpa_ms(batch, backend)
            rows.append(dict(case=name, variant=label, ms=ms, eager_ms=eager_ms, note=how))
        except RuntimeError as e:  # backend refuses the shape
            rows.append(dict(case=name, variant=label, ms=float("nan"), note=str(e).splitlines()[0][:80]))
    for r in rows:
        r["bw_pct"] = 100 * batch.kv_bytes / (r["ms"] * 1e-3) / copy_bw
        r["speedup"] = r["ms"] / rows[0]["ms"]  # how much slower than balanced
    return rows


def check_decode(lens: np.ndarray) -> float:
    """Max |balanced - SDPA on the gathered KV| on a small slice, so the timings are of a correct kernel."""
    batch = make_decode_batch(lens, seed=1)
    plan = build_decode_plan(lens, HQ, HKV, D, torch.device("cuda"), DecodeConfig())
    out = paged_decode(batch.q, batch.k_cache, batch.v_cache, batch.tables, plan, D**-0.5)
    err = 0.0
    for b, n in enumerate(lens.tolist()):
        pos = torch.arange(n, device="cuda")
        slots = batch.tables[b, pos // PAGE].long() * PAGE + pos % PAGE
        k = batch.k_cache.view(-1, HKV, D)[slots].transpose(0, 1).float()
        v = batch.v_cache.view(-1, HKV, D)[slots].transpose(0, 1).float()
        ref = F.scaled_dot_product_attention(batch.q[b].float()[:, None], k, v, enable_gqa=True)[:, 0]
        err = max(err, (out[b].float() - ref).abs().max().item())
    return err


def prefill_rows(seq: int) -> list[dict[str, Any]]:
    g = torch.Generator(device="cuda").manual_seed(0)
    blocks = -(-seq // PAGE)
    k_cache = torch.randn(blocks, PAGE, HKV, D, device="cuda", dtype=DTYPE, generator=g)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(seq, HQ, D, device="cuda", dtype=DTYPE, generator=g)
    md = AttentionMetadata(
        slot_mapping=torch.arange(seq, device="cuda"),
        query_start_loc=torch.tensor([0, seq], dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor([seq], dtype=torch.int32, device="cuda"),
        block_tables=torch.randperm(blocks, device="cuda", generator=g).to(torch.int32)[None],
        max_query_len=seq, max_seq_len=seq, block_size=PAGE,
    )
    flops = 2 * seq * seq * D * HQ  # causal: half of 4 * S^2 * D per head
    ours = prefill_mod.paged_prefill(q, k_cache, v_cache, md, D**-0.5)
    ms_ours = bench(lambda: prefill_mod.paged_prefill(q, k_cache, v_cache, md, D**-0.5, ours))
    # SDPA on the same K/V laid out contiguously (block table applied).
    slots = (md.block_tables[0].long()[:, None] * PAGE + torch.arange(PAGE, device="cuda")).flatten()[:seq]
    kc = k_cache.view(-1, HKV, D)[slots].transpose(0, 1)[None].contiguous()
    vc = v_cache.view(-1, HKV, D)[slots].transpose(0, 1)[None].contiguous()
    qc = q.transpose(0, 1)[None]
    rows: list[dict[str, Any]] = [dict(case=f"prefill {seq // 1024}K", variant="triton paged", ms=ms_ours)]
    for label, backend in [("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)]:
        try:
            with sdpa_kernel(backend):
                fn = lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=True)  # noqa: E731
                ref = fn()
                ms = bench(fn)
            rows.append(dict(case=f"prefill {seq // 1024}K", variant=label, ms=ms))
            if label == "sdpa flash":
                err = (ref[0].transpose(0, 1).float() - ours.float()).abs().max().item()
                rows[0]["max_err_vs_flash"] = err
        except RuntimeError as e:
            rows.append(dict(case=f"prefill {seq // 1024}K", variant=label, ms=float("nan"), note=str(e).splitlines()[0][:80]))
    for r in rows:
        r["tflops"] = flops / (r["ms"] * 1e-3) / 1e12
    return rows


def planner_us(lens: np.ndarray, sms: int) -> float:
    buckets = default_num_buckets(sms, HKV)
    for _ in range(50):
        plan_decode_tiles(lens, num_buckets=buckets)
    times = []
    for _ in range(500):
        t0 = time.perf_counter()
        plan_decode_tiles(lens, num_buckets=buckets)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e6)


def cases(quick: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tail = np.clip(rng.lognormal(np.log(1024), 1.3, 256), 1, 65536).astype(np.int64)
    tail[0] = 65536  # the tail reaches 64K
    out = {
        "uniform 64x4K": np.full(64, 4096),
        "skewed 1x128K+63x1K": np.array([131072] + [1024] * 63),
        "long tail 256 lognormal": tail,
        "single 128K": np.array([131072]),
        "single 256K": np.array([262144]),
    }
    return dict(list(out.items())[:2]) if quick else out


def fmt_table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    lines = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for _, key, f in cols:
            v = r.get(key, "")
            cells.append(format(v, f) if isinstance(v, float | int) and f else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the markdown report here")
    ap.add_argument("--json", default=None, help="write raw rows here")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    copy_bw = copy_bandwidth()
    head = [f"device: {props.name}, {sms} SMs; torch {torch.__version__}, triton {triton.__version__}",
            f"copy bandwidth (read+write): {copy_bw / 1e12:.2f} TB/s"]
    err = check_decode(np.array([1, 17, 4099, 300]))
    head.append(f"decode check vs fp32 SDPA on gathered KV: max abs err {err:.2e}")
    all_cases = cases(args.quick)
    head.append(f"planner, 256 long-tail requests, {default_num_buckets(sms, HKV)} buckets/head: "
                f"{planner_us(all_cases.get('long tail 256 lognormal', np.full(256, 1024)), sms):.1f} us median")
    rows: list[dict] = []
    for name, lens in all_cases.items():
        try:
            rows += decode_rows(name, lens, copy_bw, sms)
        except Exception as e:  # keep the other cases' numbers
            traceback.print_exc()
            rows.append(dict(case=name, variant="FAILED", ms=float("nan"), note=repr(e)[:100]))
        torch.cuda.empty_cache()
    tile_rows = []
    sweep = [(f"balanced waves={w}", DecodeConfig(waves=w)) for w in (2, 6, 8)]
    sweep += [(f"balanced per-tile T={t}", DecodeConfig(tile_size=t, coalesce=False)) for t in (128, 256)]
    sweep += [("static split x8", DecodeConfig(mode="static", num_splits=8))]
    for name in ("uniform 64x4K", "skewed 1x128K+63x1K", "long tail 256 lognormal", "single 128K"):
        if name not in all_cases:
            continue
        batch = make_decode_batch(all_cases[name])
        out = torch.empty_like(batch.q)
        for label, cfg in sweep:
            plan = build_decode_plan(batch.lens, HQ, HKV, D, torch.device("cuda"), cfg)
            ms = bench_graph(functools.partial(paged_decode, batch.q, batch.k_cache, batch.v_cache, batch.tables, plan, D**-0.5, out))
            tile_rows.append(dict(case=name, variant=label, ms=ms, tiles=plan.host.num_tiles,
                                  bw_pct=100 * batch.kv_bytes / (ms * 1e-3) / copy_bw, imbalance=plan.host.imbalance()))
        del batch
        torch.cuda.empty_cache()
    pre = []
    for seq in ((8192,) if args.quick else (8192, 32768)):
        pre += prefill_rows(seq)
    tuned = {
        "decode": {str(k): str(v) for k, v in getattr(decode_mod._decode_kernel, "cache", {}).items()},
        "prefill": {str(k): str(v) for k, v in getattr(prefill_mod._prefill_kernel, "cache", {}).items()},
    }
    dec_cols = [("case", "case", ""), ("variant", "variant", ""), ("time (us), graph", "ms", ".1f"),
                ("KV BW % of copy", "bw_pct", ".1f"), ("x slower than balanced", "speedup", ".2f"),
                ("plan imbalance", "imbalance", ".3f"), ("tiles", "tiles", "d"), ("programs", "programs", "d"),
                ("time (us), eager", "eager_us", ".1f"), ("note", "note", "")]
    for r in rows + tile_rows:
        r["ms"] = r["ms"] * 1e3  # report microseconds
        if "eager_ms" in r:
            r["eager_us"] = r.pop("eager_ms") * 1e3
    pre_cols = [("case", "case", ""), ("variant", "variant", ""), ("time (ms)", "ms", ".3f"),
                ("TFLOP/s", "tflops", ".0f"), ("max err vs flash", "max_err_vs_flash", ".1e"), ("note", "note", "")]
    report = "\n".join(head) + "\n\n" + fmt_table(rows, dec_cols) + "\n\nSweep (grid waves, per-tile vs runs, fixed static splits):\n\n" + \
        fmt_table(tile_rows, dec_cols[:4] + dec_cols[5:7]) + "\n\nPrefill (one causal request, paged vs contiguous SDPA):\n\n" + \
        fmt_table(pre, pre_cols) + "\n\nAutotuned configs (key -> config):\n\n```\n" + json.dumps(tuned, indent=1) + "\n```\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, tile_rows=tile_rows, prefill=pre, tuned=tuned, head=head), f, indent=1, default=str)
    print(report)


if __name__ == "__main__":
    main()
