"""Checkpoint loading: GGUF (through a converted cache), HF safetensors directories, random weights.

``load_checkpoint(ModelConfig)`` returns a ``Checkpoint``: the HF config, the tokenizer, and a
lazy stream of ``(HF parameter name, tensor)`` that the model code copies into its parameters.
"""

from tessel.engine.loader.checkpoint import Checkpoint, CheckpointError
from tessel.engine.loader.load import default_model_path, load_checkpoint

__all__ = ["Checkpoint", "CheckpointError", "default_model_path", "load_checkpoint"]
