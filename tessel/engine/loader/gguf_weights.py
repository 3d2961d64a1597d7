"""GGUF tensors as float32 torch tensors under their Hugging Face names and layout."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from tessel.engine.loader.checkpoint import check_tensor_shapes
from tessel.engine.loader.dequant import dequantize
from tessel.engine.loader.gguf_config import gguf_architecture
from tessel.engine.loader.gguf_reader import GgufFile
from tessel.engine.loader.names import hf_tensors_of_gguf

# convert_hf_to_gguf.py reorders the rows of Llama/Mistral q/k projections (HF's rotate-half RoPE ->
# GGML's interleaved RoPE); Qwen's converters do not.
_PERMUTED_ARCHS = ("llama", "mistral")


def check_gguf_tensors(gguf: GgufFile, hf_config: dict[str, Any]) -> None:
    """Fail before any dequantisation if a tensor is missing or has the wrong shape."""
    present = {
        hf: shape
        for name, info in gguf.tensors.items()
        for hf, shape in hf_tensors_of_gguf(name, info.shape, hf_config)
    }
    check_tensor_shapes(gguf.path, present, hf_config, "the config")


def iter_gguf_weights(
    gguf: GgufFile, hf_config: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantise one tensor at a time, undoing llama.cpp's q/k row permutation where it applied one."""
    permuted = gguf_architecture(gguf) in _PERMUTED_ARCHS
    heads = {"q_proj": hf_config["num_attention_heads"], "k_proj": hf_config["num_key_value_heads"]}
    for info in gguf.tensors.values():
        parts = hf_tensors_of_gguf(info.name, info.shape, hf_config)
        if not parts:  # e.g. rope_freqs, already folded into hf_config["rope_scaling"]
            continue
        array = dequantize(gguf.raw(info), info.qtype).reshape(info.shape)
        if parts[0][1] != info.shape:  # stacked experts: HF keeps one tensor per expert
            for e, (name, _) in enumerate(parts):
                yield name, torch.from_numpy(np.array(array[e], dtype=np.float32, order="C"))
            continue
        name = parts[0][0]
        proj = name.split(".")[-2]
        if permuted and proj in heads:
            array = unpermute_rows(array, heads[proj])
        # F32 comes back as a view of the read-only memory map
        if not array.flags.writeable or not array.flags.c_contiguous:
            array = np.array(array, dtype=np.float32, order="C")
        yield name, torch.from_numpy(array)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf's ``permute``: each head's rows go back from interleaved
    (x0, x_half, x1, ...) pairs to the two halves HF's rotate-half RoPE expects."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )
