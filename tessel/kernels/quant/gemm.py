"""W8A8 GEMM: ``(a @ b.T) * a_scale * b_scale + bias`` in one kernel, int8 or fp8 inputs.

a: [M, K] activations quantized per token, b: [N, K] weights quantized per output channel
(the nn.Linear layout, so both operands are K-contiguous, as int8/fp8 tensor cores want).
int8 accumulates in int32 (exact), fp8 in fp32; the epilogue applies both scales and the bias
in fp32 and casts to the output dtype, so the int32/fp32 tile never reaches memory.

On Hopper, fp8 wgmma adds into its accumulator with reduced precision (about 14 bits), which
over a K of 14336 costs ~1% of the output; the sums are promoted into a full fp32 accumulator
every ``FP8_PROMOTE_K`` elements of K (DeepGEMM's choice of 128), for a few percent of speed.

Split-K (``SPLIT_K`` > 1, decode-sized M): at M <= 64 a tile wide enough not to re-read the
activations for every few weight rows leaves too few tiles to fill the SMs (N = 4096 in tiles of
128 is 32 programs on 132 SMs). Each tile's K is then cut into ``SPLIT_K`` ranges, one program
each; every program but the last to finish parks its raw accumulator in a workspace, and the last
(an atomic arrival count per tile) adds them up and runs the epilogue, so the split costs no
extra launch. The int8 partial sums stay int32: the result is bit-exact with no split.

Launched with programmatic dependent launch (Hopper, kernels/pdl.py; up to ``PDL_MAX_M``), a
program starts while the kernel before it (the activation quantization) finishes. The weight does
not depend on that kernel, so before waiting for it each program asks L2 for the first
``PREFETCH_LINES`` 128-byte lines of each of its weight rows: a decode-sized GEMM is mostly its
weight's stream, and this starts it during the previous kernel's tail.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from tessel.kernels import pdl
from tessel.kernels.checks import FLOAT_DTYPES, check_shape, check_tensor
from tessel.kernels.quant import gemm_configs
from tessel.kernels.quant.types import FP8_DTYPE

FP8_PROMOTE_K: int | None = 128  # None: the backend's default (no promotion on Hopper)
# Per weight row, with PDL (a power of two; 0: none): 8 lines = 1 KiB, the first 4-8 of the
# pipeline's K steps. TESSEL_PREFETCH_LINES overrides it, read at each launch (benchmarks' A/B).
PREFETCH_LINES = 8
# PDL only up to this M, as measured on the engine (H100: at batch 256, +3.8% tok/s with the gate;
# at batch 64, PDL is worth 4.5-5%). A larger M runs several waves of tiles, and the next kernel,
# launched early, most likely parks its waiting programs on SMs those waves need.
# TESSEL_GEMM_PDL_MAX_M overrides.
PDL_MAX_M = 64


def prefetch_lines() -> int:
    return int(os.environ.get("TESSEL_PREFETCH_LINES", PREFETCH_LINES))


@triton.jit
def _prefetch_l2(ptrs):
    # no result is needed; the asm's dummy output keeps Triton's elementwise form
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


# M varies every step: not specialised on, so one compile serves every batch size.
@triton.jit(do_not_specialize=["M", "M_BUCKET"])
def _scaled_mm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, bias_ptr, ws_ptr, arrivals_ptr,
    M, N, K, stride_am, stride_bn, stride_cm,
    M_BUCKET,  # keys the autotuner (see gemm_configs); unused in the body, not a constexpr so
    # buckets sharing a tile config share its compiled kernel
    ACC_DTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, RAW_ACC: tl.constexpr, EVEN_K: tl.constexpr,
    IMPRECISE_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr = 1, PDL: tl.constexpr = False, PREFETCH_LINES: tl.constexpr = 0,
):
    pid = tl.program_id(0)
    pid_k = pid % SPLIT_K  # a tile's K ranges are neighbours in launch order: they run together
    pid = pid // SPLIT_K
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row tiles in a row walk the same column tiles of b while in L2.
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = offs_m % M  # rows/columns past the edge re-read valid ones; the store masks them
    rn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    k_steps = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    k_first = pid_k * k_steps
    k_last = min(k_first + k_steps, tl.cdiv(K, BLOCK_K))  # the last range may be short or empty
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + (k_first * BLOCK_K + offs_k)[None, :]
    b_ptrs = b_ptr + rn[None, :].to(tl.int64) * stride_bn + (k_first * BLOCK_K + offs_k)[:, None]
    if PREFETCH_LINES > 0:  # clamped to the row
        line: tl.constexpr = 1024 // b_ptr.dtype.element_ty.primitive_bitwidth  # elements in 128 bytes
        line_k = tl.minimum(k_first * BLOCK_K + tl.arange(0, PREFETCH_LINES) * line, K - 1)
        _prefetch_l2(b_ptr + rn[:, None].to(tl.int64) * stride_bn + line_k[None, :])
    if PDL:  # see kernels/pdl.py; nothing above reads what the previous kernel writes
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    for k in range(k_first, k_last):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < left, other=0.0)
        acc = tl.dot(a, b, acc, out_dtype=ACC_DTYPE, max_num_imprecise_acc=IMPRECISE_K)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K > 1:
        tile_size: tl.constexpr = BLOCK_M * BLOCK_N
        in_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        parts = ws_ptr + pid.to(tl.int64) * (SPLIT_K * tile_size) + in_tile
        tl.store(parts + pid_k * tile_size, acc)
        tl.debug_barrier()  # every thread's part is written before the arrival is counted
        last = tl.atomic_add(arrivals_ptr + pid, 1, sem="acq_rel") == SPLIT_K - 1
        for s in tl.static_range(SPLIT_K):
            # .cg: read the other programs' parts from L2, where their stores landed
            # the mask as a comparison of the tile: the interpreter wants a boolean array
            take = in_tile < tl.where(last & (pid_k != s), tile_size, 0)
            acc += tl.load(parts + s * tile_size, mask=take, other=0, cache_modifier=".cg")
        tl.store(arrivals_ptr + pid, 0, mask=last)  # ready for the next launch
        c_mask = c_mask & (in_tile < tl.where(last, tile_size, 0))
    if RAW_ACC:
        tl.store(c_ptrs, acc, mask=c_mask)
    else:
        out = acc.to(tl.float32) * tl.load(a_scale_ptr + rm)[:, None] * tl.load(b_scale_ptr + rn)[None, :]
        if HAS_BIAS:
            out += tl.load(bias_ptr + rn).to(tl.float32)[None, :]
        tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=c_mask)


_tuned_kernel = triton.autotune(
    configs=gemm_configs.tuned_configs(),
    key=["M_BUCKET", "N", "K"],
    prune_configs_by={"early_config_prune": gemm_configs.prune_by_bucket},
    **gemm_configs.autotune_kwargs(),
)(triton.heuristics({
    "EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
    "IMPRECISE_K": lambda args: _imprecise_k(args["a_ptr"].dtype, args["BLOCK_K"]),
})(_scaled_mm_kernel))


def _imprecise_k(dtype: torch.dtype, block_k: int) -> int | None:
    """tl.dot's max_num_imprecise_acc: it applies to fp8 only and may not exceed the tile's K."""
    if dtype != FP8_DTYPE or FP8_PROMOTE_K is None:
        return None
    return min(FP8_PROMOTE_K, block_k)


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    check_tensor("a", a, ndim=2, dtypes=(torch.int8, FP8_DTYPE))
    check_tensor("b", b, ndim=2, dtypes=(a.dtype,), device=a.device)
    check_shape("b", b, (None, a.shape[1]))


def _vector(name: str, t: torch.Tensor, n: int, device: torch.device) -> torch.Tensor:
    if t.numel() != n or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous tensor of {n} values, got shape {tuple(t.shape)}")
    check_tensor(name, t, dtypes=(torch.float32,), device=device)
    return t.reshape(-1)


@functools.cache
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


# split-K workspaces; bf16/fp16 are launch_raw's (kernels/gemv.py)
_ACC = {torch.int8: torch.int32, FP8_DTYPE: torch.float32, torch.bfloat16: torch.float32, torch.float16: torch.float32,
        torch.float32: torch.float32}
_arrivals: dict[torch.device, torch.Tensor] = {}


def _arrival_counts(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed per-tile counters the split-K programs count their arrivals in; each launch's last
    arrival sets its tile's back to 0, so one buffer per device serves every launch (one stream
    of launches at a time: the engine's)."""
    counts = _arrivals.get(device)
    if counts is None or counts.numel() < tiles:
        counts = _arrivals[device] = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
    return counts


def _launch(a, b, c, a_scale, b_scale, bias, raw: bool, config: triton.Config | None) -> None:  # type: ignore[no-untyped-def]
    m, k = a.shape
    n = b.shape[0]
    if m == 0:
        return
    pdl_max_m = int(os.environ.get("TESSEL_GEMM_PDL_MAX_M", PDL_MAX_M))
    launch = pdl.launch_options(a) if m <= pdl_max_m else {"PDL": False}
    meta = dict(
        M_BUCKET=gemm_configs.m_bucket(m), ACC_DTYPE=tl.int32 if a.dtype == torch.int8 else tl.float32,
        HAS_BIAS=bias is not None, RAW_ACC=raw, PREFETCH_LINES=prefetch_lines() if launch["PDL"] else 0, **launch,
    )
    if config is None:
        config = gemm_configs.pinned_config(_device_name(a.device), "int8" if a.dtype == torch.int8 else "fp8",
                                            meta["M_BUCKET"], n, k)
    operands = (a, b, c, a_scale, b_scale, bias if bias is not None else b_scale)
    sizes = (m, n, k, a.stride(0), b.stride(0), c.stride(0))
    if config is None:
        grid = lambda cfg: (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)  # noqa: E731
        _tuned_kernel[grid](*operands, c, c, *sizes, **meta)  # no split: workspace and counts unused
        return
    kw = config.kwargs
    tiles = triton.cdiv(m, kw["BLOCK_M"]) * triton.cdiv(n, kw["BLOCK_N"])
    split = kw.get("SPLIT_K", 1)
    ws, arrivals = c, c
    if split > 1:
        ws = torch.empty(tiles * split * kw["BLOCK_M"] * kw["BLOCK_N"], dtype=_ACC[a.dtype], device=a.device)
        arrivals = _arrival_counts(a.device, tiles)
    _scaled_mm_kernel[(tiles * split,)](*operands, ws, arrivals, *sizes, **meta, **kw, EVEN_K=k % kw["BLOCK_K"] == 0,
                                        IMPRECISE_K=_imprecise_k(a.dtype, kw["BLOCK_K"]),
                                        num_warps=config.num_warps, num_stages=config.num_stages)


def launch_raw(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: triton.Config) -> None:
    """``c = a @ b.T`` with the accumulator cast to c's dtype and no scales: any dtype pair the
    kernel's ``tl.dot`` takes (kernels/gemv.py runs bf16 through it). No checks: the caller's."""
    _launch(a, b, c, c, c, None, True, config)


def scaled_mm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: triton.Config | None = None,
) -> torch.Tensor:
    """[M, N] in ``out_dtype``; ``config`` pins one tile config instead of autotuning (tests)."""
    _check(a, b)
    if out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"out_dtype must be a float dtype, got {out_dtype}")
    a_scale = _vector("a_scale", a_scale, a.shape[0], a.device)
    b_scale = _vector("b_scale", b_scale, b.shape[0], a.device)
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES, device=a.device)
        check_shape("bias", bias, (b.shape[0],))
    c = torch.empty(a.shape[0], b.shape[0], dtype=out_dtype, device=a.device)
    _launch(a, b, c, a_scale, b_scale, bias, False, config)
    return c


def int8_mm(a: torch.Tensor, b: torch.Tensor, config: triton.Config | None = None) -> torch.Tensor:
    """``a @ b.T`` in int32 for int8 a [M, K], b [N, K]: the same kernel, its accumulator stored raw."""
    _check(a, b)
    if a.dtype != torch.int8:
        raise ValueError(f"int8_mm takes int8 inputs, got {a.dtype}")
    c = torch.empty(a.shape[0], b.shape[0], dtype=torch.int32, device=a.device)
    dummy = torch.ones(max(a.shape[0], b.shape[0]), dtype=torch.float32, device=a.device)
    _launch(a, b, c, dummy, dummy, None, True, config)
    return c
