"""Linear layers on the CPU through oneDNN, with each weight packed once at load time.

``F.linear`` re-reads the weight in its plain row-major layout on every call; oneDNN's packed
(blocked) layout is what its GEMM wants, so packing once removes that work from every step.
On this project's 2-core AVX2 machine that is 1.2-1.7x on the default model's shapes
(``benchmarks/results/offline_cpu.md``). Same function as ``F.linear``; fp32 only.

oneDNN builds (JIT-compiles) and caches a primitive per distinct input shape, ~0.8 MiB each and
up to 1024 of them: a server, whose token count per step changes every step, grew by hundreds
of MiB that way. So rows are padded up to a bucket (exact to 16, then multiples of 16), which
bounds the primitives to ~31 per weight shape, and past ``PACKED_MAX_ROWS`` rows (prefill,
where MKL's own packing is nearly as fast: 1.0-1.3x at 512 rows) the plain weight is used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACKED_MAX_ROWS = 256
_EXACT_ROWS = 16


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [out, in] in oneDNN's layout, or None where packing does not apply."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def row_bucket(rows: int) -> int:
    """The padded row count a packed GEMM of ``rows`` rows runs at."""
    return rows if rows <= _EXACT_ROWS else -(-rows // _EXACT_ROWS) * _EXACT_ROWS


def linear(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W^T + bias`` with ``packed`` as returned by ``pack(weight)``."""
    rows = x.numel() // x.shape[-1]
    if rows > PACKED_MAX_ROWS or rows == 0:
        return F.linear(x, weight, bias)
    x2 = x.reshape(rows, x.shape[-1])
    bucket = row_bucket(rows)
    if bucket != rows:
        x2 = F.pad(x2, (0, 0, 0, bucket - rows))
    out = torch.ops.mkldnn._linear_pointwise(x2, packed, bias, "none", [], "")
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])
