"""W8A8 ops: per-token activation quantization (alone, fused with RMSNorm, fused with
SiLU-and-mul) and int8/fp8 GEMMs with the dequantization fused in the epilogue.

``reference.py`` holds the plain-PyTorch twins; ``kernels.dispatch`` picks between them.
"""

from tessel.kernels.quant.types import FP8_DTYPE, QUANT_DTYPES, QuantizedTensor, qmax

__all__ = ["FP8_DTYPE", "QUANT_DTYPES", "QuantizedTensor", "qmax"]
