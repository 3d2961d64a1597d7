"""W8A8 quantization of the decoder's linear layers (int8 or fp8), in four steps:

``resolve_quant_config`` reads ``ModelConfig.quantization`` and the checkpoint's own
quantization_config; ``build_model(..., quant=)`` gives layers of an already-quantized checkpoint
their 8-bit parameters; the loader fills them; ``quantize_model`` then rotates (QuaRot) and smooths (SmoothQuant,
optional) and quantizes the float layers, and finalizes the checkpoint-quantized ones.
"""

from tessel.engine.models.layers.quantization.config import QuantConfig, resolve_quant_config
from tessel.engine.models.layers.quantization.convert import quantize_model

__all__ = ["QuantConfig", "quantize_model", "resolve_quant_config"]
