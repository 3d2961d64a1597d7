"""Model presets: Hugging Face ``config.json`` contents of real architectures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PRESET_DIR = Path(__file__).parent / "models"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def preset_path(name: str) -> Path | None:
    path = PRESET_DIR / f"{name}.json"
    return path if path.is_file() else None


def load_preset(name: str) -> dict[str, Any]:
    path = preset_path(name)
    if path is None:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(list_presets())}")
    data: dict[str, Any] = json.loads(path.read_text())
    return data
