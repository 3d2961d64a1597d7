"""What a loaded checkpoint is: the plain data the model code consumes, and the one error type."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tessel.engine.loader.names import expected_shapes

if TYPE_CHECKING:  # transformers takes ~1 s to import; only the tokenizer paths need it
    import torch
    from transformers import PreTrainedTokenizerFast


class CheckpointError(ValueError):
    """A checkpoint cannot be read; the message names the file and what is wrong with it."""


def check_tensor_shapes(
    origin: object, present: dict[str, tuple[int, ...]], hf_config: dict[str, Any], config_name: str
) -> None:
    """Every tensor the architecture needs is in ``present`` with the shape the config implies;
    else a CheckpointError naming ``origin`` (the file or directory) and the first offenders."""
    expected = expected_shapes(hf_config)
    missing = [name for name in expected if name not in present]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{origin}: missing tensors {', '.join(missing[:5])}{more}")
    for name, shape in expected.items():
        if present[name] != shape:
            raise CheckpointError(
                f"{origin}: tensor {name} has shape {present[name]}, {config_name} implies {shape}"
            )


@dataclass
class Checkpoint:
    """A model on disk, opened but not yet read: config and tokenizer now, weights on demand."""

    hf_config: dict[str, Any]
    """Contents of a Hugging Face ``config.json`` (built from metadata for a GGUF)."""
    tokenizer: PreTrainedTokenizerFast | None
    """None only for random weights of a preset that ships no tokenizer."""
    source: str
    """The file or directory it came from, for messages."""
    weights: Callable[[], Iterator[tuple[str, torch.Tensor]]]
    """Yields ``(HF parameter name, tensor)`` lazily, one tensor at a time, so a large model
    is never held twice in memory. Each call starts a fresh pass."""
    served_name: str
    """Short model name for the API (file stem, directory name or preset name)."""
    weight_slices: Callable[[], Iterator[tuple[str, Any]]] | None = None
    """The same stream with each tensor a lazy slice (``narrow`` reads only the rows or columns
    asked for), so a tensor-parallel rank reads just its shard; None where the format cannot
    (random weights, a GGUF read without its converted cache)."""
