"""Argument checks shared by the Triton launchers: each names the argument and what is wrong."""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
# A paged KV cache holds the model dtype, or E4M3 (CacheConfig.kv_cache_dtype), read back into
# the query's dtype by the attention kernels
KV_CACHE_DTYPES = (*FLOAT_DTYPES, torch.float8_e4m3fn)


def check_tensor(
    name: str,
    t: torch.Tensor,
    *,
    ndim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
    last_contiguous: bool = True,
) -> None:
    """Raise ``ValueError`` unless ``t`` has the rank, dtype, device and unit inner stride asked."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} has dtype {t.dtype}; expected one of {allowed}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} like the other inputs")
    if last_contiguous and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_shape(name: str, t: torch.Tensor, shape: Sequence[int | None]) -> None:
    """``None`` in ``shape`` matches any size."""
    ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape, strict=False))
    if not ok:
        want = tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {want}")


def check_pow2(name: str, value: int) -> None:
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}")
