"""The plain data W8A8 ops pass around, and the two 8-bit formats' ranges."""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
QUANT_DTYPES: dict[str, torch.dtype] = {"int8": torch.int8, "fp8": FP8_DTYPE}
"""``ModelConfig.quantization`` -> the storage dtype of weights and activations."""

MIN_ABSMAX = 1e-10
"""Floor on a row's max |x| so an all-zero row gets a finite scale (and zeros)."""


def qmax(dtype: torch.dtype) -> float:
    """Largest magnitude a symmetric quantizer maps to: 127 (not -128) for int8, 448 for E4M3."""
    if dtype == torch.int8:
        return 127.0
    if dtype == FP8_DTYPE:
        return 448.0
    raise ValueError(f"no 8-bit quantization to {dtype}; expected int8 or float8_e4m3fn")


@dataclass(frozen=True)
class QuantizedTensor:
    """Rows quantized symmetrically, one scale per row: ``data[r] * scale[r] ~ x[r]``.

    Per token for activations, per output channel for weights.
    """

    data: torch.Tensor  # [rows, K] int8 or float8_e4m3fn
    scale: torch.Tensor  # [rows, 1] float32: max|x[r]| / qmax
    dtype: torch.dtype  # dtype of the unquantized rows; a GEMM on activations outputs this dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape
