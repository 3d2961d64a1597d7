"""Tile configs for the W8A8 GEMMs: one set for decode-sized M, one for prefill-sized M.

The autotuner keys on ``m_bucket(M)`` rather than M, so a new batch size reuses its bucket's
choice instead of re-tuning mid-serving. Decode (M <= 64) is bound by reading the weight once:
its tiles are M-high and narrow in N so every SM streams a slice of it. Prefill (M >= 128) is
compute-bound: wide tiles, deep K steps for the int8/fp8 tensor cores.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import triton

from tessel.kernels.autotune import autotune_enabled

M_BUCKETS = (16, 32, 64, 128, 256, 512)
SMALL_M = 64  # buckets up to here use the decode configs

# (BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_M is the bucket itself
# Six of each: every config is a compile (~1 s) per dtype, paid once per process at start-up.
_DECODE = [(16, 256, 4, 4), (32, 256, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 4, 3), (128, 128, 8, 4)]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
_PREFILL = [(128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (256, 128, 128, 8, 3), (128, 128, 128, 4, 4),
            (64, 128, 128, 4, 4), (128, 64, 128, 4, 4)]
DEFAULT = (32, 32, 64, 4, 2)  # untuned (tests, interpreter): (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)


# Per-shape picks on the H200 at M = 64 (benchmarks/quant_sweep.py, CUDA-graph timed, weights
# cold in L2; a sixth entry is SPLIT_K, from its --split sweep), as vLLM ships per-device tile tables: the autotuner's flushed, eager do_bench ranks
# 10-40 us kernels partly by launch noise. TESSEL_W8A8_PINNED=0 leaves every shape to it.
# (dtype, M bucket, N, K) -> (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages[, SPLIT_K])
_PINNED: dict[str, dict[tuple[str, int, int, int], tuple[int, ...]]] = {"NVIDIA H200": {
    ("int8", 64, 6144, 4096): (64, 64, 256, 4, 5), ("int8", 64, 4096, 4096): (64, 32, 256, 4, 5),
    ("int8", 64, 28672, 4096): (64, 64, 128, 4, 3), ("int8", 64, 4096, 14336): (64, 64, 256, 4, 5, 2),
    ("fp8", 64, 6144, 4096): (64, 64, 256, 8, 5), ("fp8", 64, 4096, 4096): (64, 64, 256, 4, 5, 2),
    ("fp8", 64, 28672, 4096): (64, 64, 128, 4, 3), ("fp8", 64, 4096, 14336): (64, 64, 256, 4, 5, 2),
    # M = 256: only the clear wins of the split-K sweep (down_proj 1.21-1.22x, fp8 o_proj 1.36x
    # over the autotuner's pick); the rest stays autotuned
    ("int8", 256, 4096, 14336): (64, 128, 128, 4, 4, 2), ("fp8", 256, 4096, 14336): (64, 128, 128, 4, 4, 2),
    ("fp8", 256, 4096, 4096): (64, 64, 128, 4, 4),
}}
PINNED_ENABLED = os.environ.get("TESSEL_W8A8_PINNED", "1") == "1"


def _load_pin_file(path: str | None) -> dict[tuple[str, int, int, int], tuple[int, ...]]:
    """Extra pins for this run's device from a JSON file (``benchmarks/quant_sweep.py --pins-out``
    writes one): {"int8,64,6144,4096": [BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, SPLIT_K], ...}."""
    if not path:
        return {}
    with open(path) as f:
        raw = json.load(f)
    out = {}
    for key, shape in raw.items():
        dtype, bucket, n, k = key.split(",")
        out[(dtype, int(bucket), int(n), int(k))] = tuple(int(v) for v in shape)
    return out


_FILE_PINS = _load_pin_file(os.environ.get("TESSEL_W8A8_PIN_FILE"))


def pinned_config(device_name: str, dtype: str, bucket: int, n: int, k: int) -> triton.Config | None:
    """The measured tile for this device and shape, or None (then the autotuner picks)."""
    shape = _FILE_PINS.get((dtype, bucket, n, k)) or _PINNED.get(device_name, {}).get((dtype, bucket, n, k))
    if shape is None or not (PINNED_ENABLED and autotune_enabled()):
        return None
    return _pinned(shape, bucket <= SMALL_M)


def pinned_configs() -> list[triton.Config]:
    """Every distinct pinned tile (the GPU tests run each once)."""
    shapes = {(key[1] <= SMALL_M, shape) for table in _PINNED.values() for key, shape in table.items()}
    return [_pinned(shape, small) for small, shape in sorted(shapes)]


def _pinned(shape: tuple[int, ...], small: bool) -> triton.Config:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages[, SPLIT_K]) as a config."""
    bm, bn, bk, warps, stages = shape[:5]
    return tile_config(bm, bn, bk, warps, stages, small, shape[5] if len(shape) > 5 else 1)


def m_bucket(m: int) -> int:
    """The smallest bucket >= m (the largest past 512)."""
    return next((b for b in M_BUCKETS if m <= b), M_BUCKETS[-1])


def tile_config(bm: int, bn: int, bk: int, warps: int, stages: int, small: bool, split_k: int = 1) -> triton.Config:
    """One tile as the kernel takes it; ``small``: a decode-bucket tile (the autotuner's pruning
    reads it); ``split_k`` > 1 cuts K across programs (gemm.py)."""
    tile = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    cfg = triton.Config(tile | ({"SPLIT_K": split_k} if split_k > 1 else {}), num_warps=warps, num_stages=stages)
    cfg.for_decode = small  # type: ignore[attr-defined]  # read by prune_by_bucket only
    return cfg


def decode_configs(bucket: int) -> list[triton.Config]:
    return [tile_config(bucket, bn, bk, w, s, True) for bn, bk, w, s in _DECODE]


def prefill_configs() -> list[triton.Config]:
    return [tile_config(*shape, False) for shape in _PREFILL]


def all_configs() -> list[triton.Config]:
    """Everything the autotuner may pick (the GPU tests run each once)."""
    return [c for b in M_BUCKETS if b <= SMALL_M for c in decode_configs(b)] + prefill_configs()


def default_config() -> triton.Config:
    return tile_config(*DEFAULT, False)


def tuned_configs() -> list[triton.Config]:
    return all_configs() if autotune_enabled() else [default_config()]


def prune_by_bucket(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    """Keep the decode configs of this call's M bucket, or the prefill configs."""
    bucket = {**named_args, **kwargs}["M_BUCKET"]
    if len(configs) == 1:
        return configs
    if bucket <= SMALL_M:
        return [c for c in configs if c.for_decode and c.kwargs["BLOCK_M"] == bucket]  # type: ignore[attr-defined]
    return [c for c in configs if not c.for_decode]  # type: ignore[attr-defined]


def _quick_bench(fn: Any, quantiles: Any = None, **_: Any) -> Any:
    # Short runs: a server tunes ~6 buckets x its layer shapes x 6 configs at start-up.
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


def autotune_kwargs() -> dict[str, Any]:
    """``do_bench`` only where this Triton's autotuner takes it."""
    if "do_bench" in inspect.signature(triton.autotune).parameters:
        return {"do_bench": _quick_bench}
    return {}
