"""Typed settings and model presets. Imports no torch."""

from tessel.config.presets import list_presets, load_preset, preset_path
from tessel.config.settings import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig

__all__ = [
    "CacheConfig",
    "EngineConfig",
    "ModelConfig",
    "SchedulerConfig",
    "list_presets",
    "load_preset",
    "preset_path",
]
