"""A fast reader for the GGUF container: metadata, tensor table, and raw tensor bytes.

``gguf.GGUFReader`` builds a numpy view per array element, so the 100k tokenizer strings of a
small model take ~5 s to parse; this reader walks the same layout with ``struct`` in ~0.1 s and
memory-maps the tensor data. Layout (GGUF v2/v3): magic, version, tensor count, kv count, the
key/value pairs, the tensor infos, padding to ``general.alignment``, then the tensor data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from tessel.engine.loader.checkpoint import CheckpointError

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# fixed-width value types: uint8, int8, uint16, int16, uint32, int32, float32, bool, -, -, uint64, int64, float64
_SCALAR = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


@dataclass(frozen=True)
class GgufTensorInfo:
    """Where one tensor's bytes live and how they are encoded."""

    name: str
    shape: tuple[int, ...]  # torch (row-major) order: GGUF's ``ne`` reversed
    qtype: GGMLQuantizationType
    offset: int  # absolute, from the start of the file
    nbytes: int


@dataclass
class GgufFile:
    """A parsed GGUF: its metadata and tensor table, with the data section memory-mapped."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GgufTensorInfo]
    _data: np.ndarray  # uint8 memmap of the whole file

    def raw(self, info: GgufTensorInfo) -> np.ndarray:
        """The tensor's bytes as ``(rows..., bytes per row)`` uint8, the layout ``gguf.quants.dequantize`` takes."""
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        row_bytes = info.shape[-1] // block * type_size
        flat = self._data[info.offset : info.offset + info.nbytes]
        return flat.reshape(*info.shape[:-1], row_bytes)


class _Cursor:
    """Sequential little-endian reads over the file's bytes; running off the end is a truncation."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise CheckpointError(
                f"{self.path}: GGUF file is truncated (metadata ends at byte {len(self.buf)})"
            )
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        end = self.pos + length
        if end > len(self.buf):
            raise CheckpointError(
                f"{self.path}: GGUF file is truncated (metadata ends at byte {len(self.buf)})"
            )
        text = bytes(self.buf[self.pos : end]).decode("utf-8", errors="replace")
        self.pos = end
        return text

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALAR:  # read fixed-width arrays in one go
                dtype = np.dtype(_SCALAR[item_type].replace("?", "b1"))
                end = self.pos + dtype.itemsize * count
                if end > len(self.buf):
                    raise CheckpointError(
                        f"{self.path}: GGUF file is truncated (metadata ends at byte {len(self.buf)})"
                    )
                items = np.frombuffer(self.buf, dtype, count, self.pos).tolist()
                self.pos = end
                return items
            return [self.value(item_type) for _ in range(count)]
        if vtype not in _SCALAR:
            raise CheckpointError(
                f"{self.path}: corrupt GGUF metadata (unknown value type {vtype} at byte {self.pos})"
            )
        return self.unpack(_SCALAR[vtype])


def read_gguf(path: Path) -> GgufFile:
    """Parse ``path``'s header and tensor table; raise ``CheckpointError`` naming it if malformed."""
    if path.stat().st_size < 24:  # magic, version, two counts; np.memmap also refuses empty files
        raise CheckpointError(f"{path}: GGUF file is truncated ({path.stat().st_size} bytes)")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(data), path)  # type: ignore[arg-type]
    if bytes(cur.buf[:4]) != _MAGIC:
        raise CheckpointError(f"{path}: not a GGUF file (bad magic {bytes(cur.buf[:4])!r})")
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise CheckpointError(f"{path}: unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.unpack("<I"))
    table = [_tensor_entry(cur) for _ in range(n_tensors)]
    alignment = int(metadata.get("general.alignment", 32))
    data_start = -(-cur.pos // alignment) * alignment
    tensors = {}
    for name, shape, qtype, rel in table:
        block, type_size = GGML_QUANT_SIZES[qtype]
        if shape[-1] % block:
            raise CheckpointError(
                f"{path}: tensor {name} row length {shape[-1]} is not a multiple of {qtype.name}'s block {block}"
            )
        nbytes = prod(shape) // block * type_size
        info = GgufTensorInfo(name, shape, qtype, data_start + rel, nbytes)
        if info.offset + nbytes > len(data):
            raise CheckpointError(
                f"{path}: GGUF file is truncated: tensor {name} needs bytes up to {info.offset + nbytes}, "
                f"the file has {len(data)}"
            )
        tensors[name] = info
    return GgufFile(path, metadata, tensors, data)


def _tensor_entry(cur: _Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
    name = cur.string()
    ne = [cur.unpack("<Q") for _ in range(cur.unpack("<I"))]
    raw_type = cur.unpack("<I")
    try:
        qtype = GGMLQuantizationType(raw_type)
    except ValueError:
        raise CheckpointError(
            f"{cur.path}: tensor {name} has unknown GGML type {raw_type}"
        ) from None
    return name, tuple(reversed(ne)), qtype, cur.unpack("<Q")
