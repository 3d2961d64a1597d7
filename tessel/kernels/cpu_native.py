"""Builds and loads the CPU engine's C kernels, as vLLM's CPU backend ships C++ ones:
``cpu_decode.c`` (decode attention over a paged cache is memory-bound, and plain torch ops can
only reach it by gathering the context into a padded copy first, which reads and writes every
byte again) and ``cpu_elementwise.c`` (norms, SiLU-and-mul and RoPE in one pass each).

Each source is compiled once per machine with the system C compiler into
``$TESSEL_CACHE_DIR/kernels`` (default ``~/.cache/tessel/kernels``), keyed by the source and
flags; where no compiler works, or ``TESSEL_CPU_KERNELS`` is not ``native``, ``load_library``
returns None and the engine keeps the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger("tessel.kernels")

SOURCES = {name: Path(__file__).with_name(f"{name}.c") for name in ("cpu_decode", "cpu_elementwise")}
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only", "-fPIC"]
LINK_FLAGS = ["-shared", "-fopenmp"]
"""Linked apart from the compile, without -ffast-math: linking with it adds GCC's crtfastmath.o,
whose constructor turns on flush-to-zero / denormals-are-zero in whichever thread loads the
library, changing float results of everything else that thread runs (hypothesis refuses to run
there at all)."""


def _cache_dir() -> Path:
    root = os.environ.get("TESSEL_CACHE_DIR") or Path.home() / ".cache" / "tessel"
    return Path(root) / "kernels"


def _build(source_path: Path) -> Path | None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = source_path.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, *FLAGS, *LINK_FLAGS]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{source_path.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built, obj = Path(tmp) / target.name, Path(tmp) / f"{source_path.stem}.o"
        for cmd in (
            [compiler, *FLAGS, "-c", "-o", str(obj), str(source_path)],
            [compiler, *LINK_FLAGS, "-o", str(built), str(obj), "-lm"],
        ):
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                log.warning("could not build %s (%s); the CPU engine uses torch ops instead",
                            source_path.name, result.stderr.strip()[-300:])
                return None
        os.replace(built, target)  # atomic: a concurrent builder finds a whole file or none
    return target


@cache
def _open(name: str) -> ctypes.CDLL | None:
    try:
        path = _build(SOURCES[name])
        return ctypes.CDLL(str(path)) if path is not None else None
    except OSError as exc:
        log.warning("could not load the CPU kernels of %s: %s", name, exc)
        return None


def load_library(name: str) -> ctypes.CDLL | None:
    """The compiled ``<name>.c`` (built on first use), or None where native kernels are off
    (``TESSEL_CPU_KERNELS`` other than ``native``) or cannot be built. Callers cache the answer:
    the variable is read once per process, as reading it costs as much as a small kernel."""
    if os.environ.get("TESSEL_CPU_KERNELS", "native") != "native":
        return None
    return _open(name)


@cache
def decode_kernel() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """The compiled ``paged_decode_f32``, or None where it cannot be built or loaded."""
    lib = load_library("cpu_decode")
    if lib is None:
        return None
    fn = lib.paged_decode_f32
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, p, p, p, p, p, p, i, i, i, i, i, i, ctypes.c_float, i]
    fn.restype = i
    return fn


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    rows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request: q [B, Hq, D] fp32 over its first ``seq_lens[b]`` cached
    tokens; block_tables [B, W] and seq_lens [B] int64 -> [B, Hq, D].

    With ``rows`` (int64 [B]), request b's query is ``q[rows[b]]`` of a larger q [T, Hq, D] and its
    output goes to ``out[rows[b]]`` (out required, q's shape): a mixed step's decode rows are
    read and written in place, and the requests are taken in the order given."""
    fn = decode_kernel()
    if fn is None:
        raise RuntimeError("the CPU decode kernel is not available")
    num_heads, head_dim = q.shape[1:]
    batch = block_tables.shape[0]
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    for name, t, dtype in (("q", q, torch.float32), ("k_cache", k_cache, torch.float32),
                           ("v_cache", v_cache, torch.float32), ("block_tables", block_tables, torch.int64),
                           ("seq_lens", seq_lens, torch.int64)):
        if t.dtype != dtype or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"{name} must be a contiguous {dtype} CPU tensor, got {t.dtype} {tuple(t.stride())}")
    if rows is not None:
        if rows.dtype != torch.int64 or not rows.is_contiguous() or rows.shape != (batch,) or out is None:
            raise ValueError(f"rows must be a contiguous int64 [{batch}] tensor, with out given")
    elif q.shape[0] != batch:
        raise ValueError(f"q has {q.shape[0]} rows for {batch} requests; pass rows to pick them")
    if cache_dim != head_dim or v_cache.shape != k_cache.shape or seq_lens.shape != (batch,):
        raise ValueError(f"shapes disagree: q {tuple(q.shape)}, cache {tuple(k_cache.shape)}, tables {tuple(block_tables.shape)}")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 tensor of q's shape {tuple(q.shape)}")
    code = fn(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(), seq_lens.data_ptr(),
              rows.data_ptr() if rows is not None else None, out.data_ptr(), batch, num_heads, num_kv_heads, head_dim,
              block_size, block_tables.shape[1], scale, torch.get_num_threads())
    if code != 0:
        raise ValueError(f"the CPU decode kernel does not take this shape (code {code}): "
                         f"{num_heads} q heads, {num_kv_heads} KV heads, head_dim {head_dim}, block {block_size}")
    return out
