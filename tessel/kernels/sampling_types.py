"""The per-row keys a temperature draw reads (plain data: the reference imports it without Triton)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TemperatureDraws:
    """What makes a row's draw: its temperature and the (seed, step) its random numbers are keyed by."""

    inv_temperature: torch.Tensor  # [B] float32: 1 / temperature, 0 on greedy rows
    seeds: torch.Tensor  # [B] int64: the request's seed
    steps: torch.Tensor  # [B] int64: tokens it has generated (a fresh key per token)
