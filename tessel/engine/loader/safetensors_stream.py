"""Write a safetensors file one tensor at a time, so a converted model is never whole in memory.

``safetensors.torch.save_file`` wants a dict of every tensor; the format itself only needs the
header (names, dtypes, shapes, offsets) up front, which a GGUF tensor table already gives us.
Format: 8-byte little-endian header length, JSON header padded to 8 bytes, raw data.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from math import prod
from pathlib import Path

import torch

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def write_safetensors(
    path: Path,
    plan: dict[str, tuple[tuple[int, ...], torch.dtype]],
    tensors: Iterable[tuple[str, torch.Tensor]],
) -> None:
    """Write ``tensors`` to ``path``; they must arrive in ``plan``'s order with its shapes and dtypes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, dtype) in plan.items():
        end = offset + prod(shape) * dtype.itemsize
        header[name] = {
            "dtype": _DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, end],
        }
        offset = end
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    expected = iter(plan.items())
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(blob)))
        out.write(blob)
        for name, tensor in tensors:
            want_name, (want_shape, want_dtype) = next(expected)
            if (name, tuple(tensor.shape), tensor.dtype) != (want_name, want_shape, want_dtype):
                raise RuntimeError(
                    f"tensor stream out of plan: got {name} {tuple(tensor.shape)} {tensor.dtype}, "
                    f"planned {want_name} {want_shape} {want_dtype}"
                )
            out.write(
                tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data
            )  # bytes, no copy
        if next(expected, None) is not None:
            raise RuntimeError(f"tensor stream ended early writing {path}")
