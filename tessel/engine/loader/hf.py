"""Hugging Face checkpoint directories: config.json, safetensors (single or sharded), tokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from tessel.engine.loader.checkpoint import Checkpoint, CheckpointError, check_tensor_shapes
from tessel.engine.loader.names import SUPPORTED_ARCHITECTURES

_INDEX, _SINGLE = "model.safetensors.index.json", "model.safetensors"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers older exports saved; recomputed by the model


def read_hf_config(directory: Path) -> dict[str, Any]:
    """``config.json``, checked to name an architecture the engine implements."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(
            f"{directory}: missing config.json (not a Hugging Face checkpoint directory)"
        )
    try:
        config: dict[str, Any] = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    archs = config.get("architectures") or []
    if not archs or archs[0] not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"{path}: unknown architecture {archs[0] if archs else None!r}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return normalise_rope(config)


def normalise_rope(config: dict[str, Any]) -> dict[str, Any]:
    """Always ``rope_theta`` plus ``rope_scaling`` (None or a dict with ``rope_type``).

    transformers 5 writes both inside ``rope_parameters``; Hub configs use the top-level keys,
    older ones spell ``rope_type`` as ``type``. Model code reads one spelling.
    """
    config = dict(config)
    nested = dict(config.get("rope_parameters") or {})
    config.setdefault("rope_theta", nested.pop("rope_theta", 10000.0))
    scaling = config.get("rope_scaling") or (
        nested if nested.get("rope_type", "default") != "default" else None
    )
    if scaling is not None:
        scaling = dict(scaling)
        scaling.setdefault("rope_type", scaling.get("type"))
        scaling.pop("rope_theta", None)
    config["rope_scaling"] = scaling
    return config


def tensor_files(directory: Path) -> dict[Path, list[str]]:
    """Each safetensors file with the parameter names it holds, validated against headers."""
    index = directory / _INDEX
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc!r})") from None
        files: dict[Path, list[str]] = {}
        for name, shard_name in weight_map.items():
            files.setdefault(directory / shard_name, []).append(name)
        for shard in files:
            if not shard.is_file():
                raise CheckpointError(
                    f"{index}: names shard {shard.name}, which does not exist in {directory}"
                )
        return files
    single = directory / _SINGLE
    if not single.is_file():
        raise CheckpointError(
            f"{directory}: no {_SINGLE} or {_INDEX} (only safetensors weights are supported)"
        )
    return {single: sorted(_header(single))}


def _header(path: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes from a safetensors header; a corrupt or truncated file fails here."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: corrupt or truncated safetensors file ({exc})") from None


def _check_tensors(
    directory: Path, files: dict[Path, list[str]], hf_config: dict[str, Any]
) -> None:
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        shapes.update(_header(path))
    for path, names in files.items():
        absent = [n for n in names if n not in shapes]
        if absent:
            raise CheckpointError(
                f"{path}: the index lists {absent[0]}, which the file does not hold"
            )
    check_tensor_shapes(directory, shapes, hf_config, "config.json")


def iter_safetensors(files: dict[Path, list[str]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Read tensors lazily, one file open at a time, in the file's own dtype."""
    for path, names in files.items():
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                if not name.endswith(_IGNORED_SUFFIXES):
                    yield name, f.get_tensor(name)


class SafetensorsSlice:
    """One tensor of an open safetensors file, read only in the part a rank asks for."""

    def __init__(self, handle: Any, name: str) -> None:
        self._slice = handle.get_slice(name)
        self.shape = tuple(self._slice.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = (slice(None),) * dim + (slice(start, start + length),)
        tensor: torch.Tensor = self._slice[index]
        return tensor

    def read(self) -> torch.Tensor:
        tensor: torch.Tensor = self._slice[...]
        return tensor


def iter_safetensors_slices(files: dict[Path, list[str]]) -> Iterator[tuple[str, SafetensorsSlice]]:
    """``iter_safetensors``, each tensor a lazy slice: a tensor-parallel rank reads its rows only."""
    for path, names in files.items():
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                if not name.endswith(_IGNORED_SUFFIXES):
                    yield name, SafetensorsSlice(f, name)


def load_hf_checkpoint(directory: Path) -> Checkpoint:
    """Open a HF directory: config and tokenizer now, weights on demand."""
    from tessel.engine.tokenizer import load_tokenizer

    hf_config = read_hf_config(directory)
    files = tensor_files(directory)
    _check_tensors(directory, files, hf_config)
    try:
        tokenizer = load_tokenizer(directory)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot load its tokenizer ({exc})") from None
    return Checkpoint(
        hf_config=hf_config,
        tokenizer=tokenizer,
        source=str(directory),
        weights=lambda: iter_safetensors(files),
        served_name=directory.resolve().name,
        weight_slices=lambda: iter_safetensors_slices(files),
    )
