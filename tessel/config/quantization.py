"""Which layers W8A8 quantization touches, stated once (README "Quantization" repeats it).

By default only the decoder's four linear layers are quantized; everything else keeps the model
dtype: the embedding (a row gather), lm_head (the logits, where int8 costs some accuracy) and
every RMSNorm gain (a vector, and where SmoothQuant folds its scales). ``ModelConfig.quantize_lm_head``
opts the LM head in (on the 8B: 1.46x against 1.39x bf16 decode at batch 64; on the default model,
half a point of top-1 agreement). Names are the module names of ``engine/models/llama.py``.
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
