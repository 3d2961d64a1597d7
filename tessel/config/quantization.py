"""Which layers W8A8 quantization touches, stated once (README "Quantization" repeats it).

Only the decoder's four linear layers are quantized; everything else keeps the model dtype:
the embedding and lm_head (a 49k-152k vocabulary row gather and the logits, where int8 costs
accuracy for little speed), and every RMSNorm gain (a vector, and where SmoothQuant folds its
scales). Names are the module names of ``engine/models/llama.py``.
"""

QUANTIZED_LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
"""Linear layers that get int8/fp8 weights and per-token quantized inputs."""

UNQUANTIZED_LAYERS = (
    "embed_tokens",
    "lm_head",
    "input_layernorm",
    "post_attention_layernorm",
    "norm",
    "q_norm",
    "k_norm",
)
"""Layers that stay in the model dtype whatever ``ModelConfig.quantization`` says."""

CHECKPOINT_FRAGMENTS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""Our fused layers -> the checkpoint's separate layers (for a checkpoint's ignore list)."""
