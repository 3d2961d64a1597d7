"""Open a GGUF: from its converted cache when warm, else parse, dequantise and fill the cache."""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from tessel.engine.loader.cache import content_key, write_atomically, write_json
from tessel.engine.loader.checkpoint import Checkpoint, CheckpointError
from tessel.engine.loader.gguf_config import hf_config_from_gguf
from tessel.engine.loader.gguf_reader import GgufFile, read_gguf
from tessel.engine.loader.gguf_weights import check_gguf_tensors, iter_gguf_weights
from tessel.engine.loader.hf import load_hf_checkpoint
from tessel.engine.loader.names import expected_shapes, hf_tensors_of_gguf
from tessel.engine.loader.safetensors_stream import write_safetensors

logger = logging.getLogger(__name__)

# "SmolLM2-135M-Instruct.Q4_1" -> "SmolLM2-135M-Instruct"; also "-Q4_K_M", ".F16", ".BF16"
_QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d\w*|B?F(?:16|32))$", re.IGNORECASE)


def served_name_of(path: Path) -> str:
    """The file stem without its quantisation suffix."""
    return _QUANT_SUFFIX.sub("", path.stem) or path.stem


def load_gguf_checkpoint(path: Path, root: Path) -> Checkpoint:
    """Warm: open ``root/<content key>`` (~1 s). Cold: convert into it first (~4-6 s for 135M)."""
    cached = root / content_key(path)
    if cached.is_dir():
        try:
            return _from_cache(cached, path)
        except CheckpointError as exc:  # e.g. a file removed by hand: rebuild rather than fail
            logger.warning(
                "converted cache %s is unusable (%s); converting %s again", cached, exc, path
            )
            shutil.rmtree(cached, ignore_errors=True)
    gguf = read_gguf(path)
    hf_config = hf_config_from_gguf(gguf)
    check_gguf_tensors(gguf, hf_config)
    tokenizer = _gguf_tokenizer(gguf)
    logger.info("converting %s into %s (once; later loads reuse it)", path.name, cached)
    try:
        write_atomically(cached, lambda tmp: _convert(gguf, hf_config, tokenizer, tmp))
    except OSError as exc:
        # read-only home or full disk: serve straight from the GGUF, just slower next time
        logger.warning(
            "cannot write converted cache %s (%s); loading %s uncached", cached, exc, path
        )
        return Checkpoint(
            hf_config,
            tokenizer,
            str(path),
            lambda: iter_gguf_weights(gguf, hf_config),
            served_name_of(path),
        )
    return _from_cache(cached, path)


def _from_cache(cached: Path, path: Path) -> Checkpoint:
    return replace(load_hf_checkpoint(cached), source=str(path), served_name=served_name_of(path))


def _gguf_tokenizer(gguf: GgufFile) -> Any:
    from tessel.engine.tokenizer import tokenizer_from_gguf_metadata

    try:
        return tokenizer_from_gguf_metadata(gguf.metadata)
    except (ValueError, KeyError, IndexError) as exc:
        raise CheckpointError(f"{gguf.path}: cannot build its tokenizer ({exc})") from None


def _convert(gguf: GgufFile, hf_config: dict[str, Any], tokenizer: Any, out: Path) -> None:
    """Write config.json, tokenizer files and float32 model.safetensors into ``out``."""
    write_json(out / "config.json", hf_config)
    tokenizer.save_pretrained(str(out))
    shapes = expected_shapes(hf_config)
    hf_names = (
        hf for name, info in gguf.tensors.items() for hf, _ in hf_tensors_of_gguf(name, info.shape, hf_config)
    )
    plan = {name: (shapes[name], torch.float32) for name in hf_names if name in shapes}
    stream = (item for item in iter_gguf_weights(gguf, hf_config) if item[0] in plan)
    # disable=None: a bar on a terminal, nothing in a log file or container log, where the
    # carriage-return frames would be unparseable lines (the log line above says the same once)
    bar = tqdm(
        stream,
        total=len(plan),
        desc=f"Converting {gguf.path.name}",
        unit="tensor",
        delay=1.0,
        disable=None,
    )
    write_safetensors(out / "model.safetensors", plan, bar)
    bar.close()
