"""Linear layers on the CPU through oneDNN, with each weight packed once at load time.

``F.linear`` re-reads the weight in its plain row-major layout on every call; oneDNN's packed
(blocked) layout is what its GEMM wants, so packing once removes that work from every step.
On this project's 2-core AVX2 machine that is 1.2-1.7x on the default model's shapes
(``benchmarks/results/offline_cpu.md``). Same function as ``F.linear``; fp32 only.
"""

from __future__ import annotations

import torch


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [out, in] in oneDNN's layout, or None where packing does not apply."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W^T + bias`` with ``W`` as returned by ``pack``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
