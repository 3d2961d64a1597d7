"""The converted-GGUF cache: a HF-style directory (config.json, model.safetensors, tokenizer
files) per GGUF, keyed by the file's content, written atomically.

A cold GGUF load dequantises every tensor (seconds); a warm one memory-maps float32 safetensors.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_FORMAT = 1
"""Bump when the converted layout changes, so old caches are not reused."""

# the whole GGUF header (metadata + tensor table) of any model we serve fits in 16 MiB
_HEAD = 16 << 20
_SAMPLES, _SAMPLE = 64, 64 << 10


def cache_root(cache_dir: str | None) -> Path:
    """``cache_dir`` or ``~/.cache/tessel``."""
    return Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "tessel"


def content_key(path: Path) -> str:
    """A hex key for ``path``'s content, in constant time whatever the file's size.

    Hashing a whole 40 GB GGUF would take longer than the warm load it enables, so this hashes
    (blake2b) the size, the first 16 MiB -- the header: every metadata value, tensor name, shape,
    type and offset, plus the first weights -- and 64 KiB at 64 evenly spaced offsets through the
    data. Any re-quantisation or different fine-tune changes the header or the sampled weights.
    The file's name and mtime are left out on purpose: a copied file still hits its cache.
    """
    size = path.stat().st_size
    digest = hashlib.blake2b(f"tessel-gguf-{CACHE_FORMAT}-{size}".encode(), digest_size=16)
    with path.open("rb") as f:
        digest.update(f.read(_HEAD))
        if size > _HEAD:
            step = (size - _HEAD) // _SAMPLES
            for i in range(_SAMPLES):
                f.seek(_HEAD + i * step)
                digest.update(f.read(_SAMPLE))
            f.seek(max(_HEAD, size - _SAMPLE))
            digest.update(f.read(_SAMPLE))
    return digest.hexdigest()


def write_atomically(final: Path, fill: Callable[[Path], None]) -> None:
    """Let ``fill`` write a directory, then move it to ``final`` in one rename.

    A process killed midway leaves only a ``.tmp-*`` sibling, never a half-filled ``final``; if
    another process finished first, its copy is kept and ours discarded.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        fill(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: Path, data: dict[str, object]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
