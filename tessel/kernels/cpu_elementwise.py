"""The CPU engine's elementwise ops through ``cpu_elementwise.c``: ``reference``'s functions and
contracts (new output tensors, inputs left untouched), one pass and one parallel region each.

Shapes that cannot be right raise ``ValueError`` naming the argument, on either path. What the C
kernels do not take (no compiler, ``TESSEL_CPU_KERNELS`` off, other dtypes than fp32, non-CPU
or non-contiguous tensors) goes to the reference, which handles every dtype and layout.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import NamedTuple

import torch

from tessel.kernels import cpu_native, reference


class _Kernels(NamedTuple):
    rms_norm: ctypes._CFuncPtr  # type: ignore[name-defined]
    silu_and_mul: ctypes._CFuncPtr  # type: ignore[name-defined]
    rope: ctypes._CFuncPtr  # type: ignore[name-defined]


@cache
def kernels() -> _Kernels | None:
    """The bound C functions, or None where native CPU kernels are off or cannot be built
    (decided once per process; tests that change ``TESSEL_CPU_KERNELS`` clear this cache)."""
    lib = cpu_native.load_library("cpu_elementwise")
    if lib is None:
        return None
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    norm, silu, rope = lib.rms_norm_f32, lib.silu_and_mul_f32, lib.rope_f32
    norm.argtypes, norm.restype = [p, p, p, p, p, i64, i64, i64, i64, i64, ctypes.c_float, i], None
    silu.argtypes, silu.restype = [p, p, i64, i64, i], None
    rope.argtypes, rope.restype = [p, p, p, p, p, p, i64, i, i, i, i64, i64, i64, i], i
    return _Kernels(norm, silu, rope)


_F32 = torch.float32


def _native(*tensors: torch.Tensor) -> bool:
    # is_cpu / `is` rather than device.type / ==: this runs several times per layer per step
    return all(t.dtype is _F32 and t.is_cpu and t.is_contiguous() for t in tensors)


def _check_norm_shapes(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.dim() < 1 or weight.shape != x.shape[-1:]:
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected ({x.shape[-1] if x.dim() else '?'},)"
                         f" for x of shape {tuple(x.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)}; expected x's {tuple(x.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim, as ``reference.rms_norm``."""
    _check_norm_shapes(x, weight, None)
    fns = kernels()
    if fns is None or not _native(weight) or x.numel() == 0:
        return reference.rms_norm(x, weight, eps)
    hidden = x.shape[-1]
    if _native(x):
        heads, token_stride = 1, hidden
    elif x.dim() == 3 and _heads_packed(x):  # per-head q/k norm on a view into the qkv rows
        heads, token_stride = x.shape[1], x.stride(0)
    else:
        return reference.rms_norm(x, weight, eps)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    fns.rms_norm(x.data_ptr(), None, weight.data_ptr(), out.data_ptr(), None,
                 x.numel() // hidden, hidden, heads, token_stride, hidden, eps, torch.get_num_threads())
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), both new tensors, as ``reference.fused_add_rms_norm``."""
    _check_norm_shapes(x, weight, residual)
    fns = kernels()
    if fns is None or not _native(x, residual, weight) or x.numel() == 0:
        return reference.fused_add_rms_norm(x, residual, weight, eps)
    hidden = x.shape[-1]
    out, new_residual = torch.empty_like(x), torch.empty_like(x)
    fns.rms_norm(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), out.data_ptr(), new_residual.data_ptr(),
                 x.numel() // hidden, hidden, 1, hidden, hidden, eps, torch.get_num_threads())
    return out, new_residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` -> ``[..., d]``, as ``reference.silu_and_mul``."""
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be even (gate | up), got shape {tuple(x.shape)}")
    fns = kernels()
    if fns is None or not _native(x) or x.numel() == 0:
        return reference.silu_and_mul(x)
    d = x.shape[-1] // 2
    out = x.new_empty(x.shape[:-1] + (d,)) if x.dim() != 2 else torch.empty(x.shape[0], d)
    fns.silu_and_mul(x.data_ptr(), out.data_ptr(), x.numel() // (2 * d), d, torch.get_num_threads())
    return out


def _check_rope_shapes(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"q and k must be [T, H, D] with the same T and D, got {tuple(q.shape)} and {tuple(k.shape)}")
    if positions.shape != q.shape[:1] or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be [T] int32/int64, got {tuple(positions.shape)} {positions.dtype} for T={q.shape[0]}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != q.shape[2] or q.shape[2] % 2:
        raise ValueError(f"cos_sin_cache must be [max_pos, head_dim] with an even head_dim {q.shape[2]}, "
                         f"got {tuple(cos_sin_cache.shape)}")


def _heads_packed(t: torch.Tensor) -> bool:
    """Tokens may sit any stride apart (views into the qkv projection); a token's heads may not."""
    return t.dtype is _F32 and t.is_cpu and t.stride()[1:] == (t.shape[2], 1)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox rotary embedding of q [T, Hq, D] and k [T, Hkv, D] into new contiguous tensors, as
    ``reference.apply_rope``; positions index rows of the cos | sin cache."""
    _check_rope_shapes(q, k, positions, cos_sin_cache)
    fns = kernels()
    if (fns is None or q.shape[0] == 0 or not (_heads_packed(q) and _heads_packed(k))
            or not _native(cos_sin_cache) or not positions.is_cpu):
        return reference.apply_rope(q, k, positions, cos_sin_cache)
    tokens, num_heads, head_dim = q.shape
    pos = positions if positions.dtype is torch.int64 and positions.is_contiguous() else positions.long().contiguous()
    # empty_like: a third of torch.empty(shape)'s cost on this path, and contiguous either way
    contiguous = torch.contiguous_format
    q_out, k_out = torch.empty_like(q, memory_format=contiguous), torch.empty_like(k, memory_format=contiguous)
    code = fns.rope(q.data_ptr(), k.data_ptr(), q_out.data_ptr(), k_out.data_ptr(), pos.data_ptr(),
                    cos_sin_cache.data_ptr(), tokens, num_heads, k.shape[1], head_dim, q.stride(0), k.stride(0),
                    cos_sin_cache.shape[0], torch.get_num_threads())
    if code != 0:
        raise ValueError(f"positions must lie in [0, {cos_sin_cache.shape[0]}) (the cos_sin_cache rows)")
    return q_out, k_out
