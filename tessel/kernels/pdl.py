"""Programmatic dependent launch (PDL, Hopper and later) for the small kernels of a decode step.

At batch 1 a decode layer is a chain of GEMVs and six or so kernels that each do a microsecond's
work or less (norms, RoPE + KV write, attention, merge, SiLU-mul), and a kernel boundary costs
about as much again: the next grid is launched only once the previous one has drained. Launched
with PDL, a kernel's programs may start while the kernel before it finishes; each of ours waits
(``griddepcontrol.wait``) before its first memory access, so it sees everything the previous
kernel wrote, and then lets the kernel after it launch early. Only the launch latency overlaps;
the order of memory effects is the stream's. Off: ``TESSEL_PDL=0``, and wherever this Triton or
GPU lacks it (the interpreter included).
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import torch

try:  # Triton >= 3.3; kernels call them as tl.extra.cuda.gdc_*, which this import loads
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    gdc_wait = None


@cache
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    """Whether launches working on ``t`` use PDL."""
    if not t.is_cuda or gdc_wait is None or os.environ.get("TESSEL_PDL", "1") == "0":
        return False
    return _device_supports(t.device.index if t.device.index is not None else torch.cuda.current_device())


def launch_options(t: torch.Tensor) -> dict[str, Any]:
    """Keyword arguments for a kernel launch: the kernel's ``PDL`` flag and Triton's launch option."""
    return {"PDL": True, "launch_pdl": True} if enabled(t) else {"PDL": False}
