"""GGML block dequantisation to float32: whole-tensor numpy for the common block types,
``gguf.quants.dequantize`` for the rest.

gguf's implementation walks rows in groups (``np.array_split``) and, on a memory-mapped input,
pays numpy's memmap bookkeeping per group; for Q4_1/Q8_0 these one-pass versions are ~3x faster,
which is most of a cold GGUF load. Each is checked bit-exact against gguf's in the tests.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

Q = GGMLQuantizationType


def dequantize(raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """``raw``: uint8 ``(rows..., bytes per row)`` -> float32 ``(rows..., values per row)``."""
    raw = raw.view(np.ndarray)  # drop the memmap subclass: its per-view bookkeeping is slow
    if qtype == Q.F32:
        return raw.view(np.float32)
    if qtype in _FAST:
        block_bytes, fn = _FAST[qtype]
        blocks = raw.reshape(-1, block_bytes)
        return fn(blocks).reshape(*raw.shape[:-1], -1)
    return np.asarray(gguf_dequantize(raw, qtype), dtype=np.float32)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte ``start`` of each block, as a float32 column."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles are elements 0..15 of a block, high nibbles 16..31 (GGML's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)


def _q8_0(blocks: np.ndarray) -> np.ndarray:  # f16 scale, 32 x int8
    values = blocks[:, 2:].view(np.int8).astype(np.float32)
    values *= _f16(blocks, 0)
    return values


def _q4_0(blocks: np.ndarray) -> np.ndarray:  # f16 scale, 16 bytes of 4-bit values offset by 8
    values = _nibbles(blocks[:, 2:])
    values -= 8.0
    values *= _f16(blocks, 0)
    return values


def _q4_1(blocks: np.ndarray) -> np.ndarray:  # f16 scale, f16 min, 16 bytes of 4-bit values
    values = _nibbles(blocks[:, 4:])
    values *= _f16(blocks, 0)
    values += _f16(blocks, 2)
    return values


def _f16_tensor(blocks: np.ndarray) -> np.ndarray:
    return blocks.view(np.float16).astype(np.float32)


_FAST = {Q.Q8_0: (34, _q8_0), Q.Q4_0: (18, _q4_0), Q.Q4_1: (20, _q4_1), Q.F16: (2, _f16_tensor)}
