"""Random weights of a real architecture's exact shapes, for benchmarks without a download."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tessel.config.presets import load_preset, preset_path
from tessel.engine.loader.checkpoint import Checkpoint, CheckpointError
from tessel.engine.loader.hf import normalise_rope, read_hf_config
from tessel.engine.loader.names import expected_shapes, is_norm

INIT_STD = 0.02
"""Std of the random weights: the usual HF init, small enough that activations stay finite."""


def random_weights(hf_config: dict[str, Any], seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter generated only when asked for (a 70B never sits in memory), norms at 1.

    One generator seeded once and walked in a fixed order, so a seed always gives the same model.
    """
    generator = torch.Generator().manual_seed(seed)
    for name, shape in expected_shapes(hf_config).items():
        if is_norm(name):
            yield name, torch.ones(shape)
        else:
            yield name, torch.empty(shape).normal_(0.0, INIT_STD, generator=generator)


def load_dummy_checkpoint(target: str, seed: int) -> Checkpoint:
    """``target`` is a preset name (no tokenizer) or a HF directory (its config, and its tokenizer if any)."""
    tokenizer = None
    directory = Path(target).expanduser()
    if directory.is_dir():
        hf_config = read_hf_config(directory)
        if (directory / "tokenizer.json").is_file():
            from tessel.engine.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(directory)
        served_name = directory.resolve().name
    elif preset_path(target) is not None:
        hf_config, served_name = normalise_rope(load_preset(target)), target
    else:
        raise CheckpointError(
            f"{target}: dummy weights need a preset name or a directory with config.json; "
            f"it is neither (see config/models/)"
        )
    return Checkpoint(
        hf_config=hf_config,
        tokenizer=tokenizer,
        source=str(directory) if directory.is_dir() else f"preset {target}",
        weights=lambda: random_weights(hf_config, seed),
        served_name=served_name,
    )
