"""Reading an E4M3 V tile as 32-bit words, so the tensor cores get it without byte-wide loads.

P·V wants consecutive tokens of V in each thread's operand registers, and the cache stores V
token-major. For 16-bit values ``ldmatrix.trans`` transposes on the way out of shared memory;
sm_90 has no 8-bit form, so a tile loaded as E4M3 reaches the operand layout one
``ld.shared.b8`` per byte (``benchmarks/results/fp8_decode_compile_cpu.md``). Loading the tile as
words, widening each word's four bytes in the layout they were loaded in and putting the values
back in order with ``join``/``reshape`` makes the transpose happen on 16-bit values instead:
Triton's layout propagation stops at the reshape, so the widened tile goes through shared memory
and ``ldmatrix.trans`` as a bf16 cache's would. Plain Triton, so the CPU interpreter runs it too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def can_read_words(cache: torch.Tensor) -> bool:
    """Whether every row of ``cache`` ([blocks, page, heads, D], E4M3) starts on a 4-byte boundary."""
    return (
        cache.stride(3) == 1
        and all(s % 4 == 0 for s in cache.stride()[:3])
        and cache.data_ptr() % 4 == 0
    )


@triton.jit
def _byte(words, i: tl.constexpr, dtype: tl.constexpr):
    b = ((words >> (8 * i)) & 0xFF).to(tl.uint8)
    return b.to(tl.float8e4nv, bitcast=True).to(dtype)


@triton.jit
def load_e4m3_words(word_ptrs, mask, ROWS: tl.constexpr, D: tl.constexpr, dtype: tl.constexpr):
    """The [ROWS, D] E4M3 tile whose rows start at ``word_ptrs`` ([ROWS, D // 4] int32 pointers,
    one per 4 bytes) widened to ``dtype``; masked rows read as zeros."""
    w = tl.load(word_ptrs, mask=mask, other=0)
    # byte i of a little-endian word is column 4 * j + i: join pairs (0, 2) and (1, 3), so that
    # the reshape's row-major flattening of [ROWS, D // 4, 2, 2] lays them out in that order
    lo = tl.join(_byte(w, 0, dtype), _byte(w, 2, dtype))
    hi = tl.join(_byte(w, 1, dtype), _byte(w, 3, dtype))
    return tl.reshape(tl.join(lo, hi), (ROWS, D))
