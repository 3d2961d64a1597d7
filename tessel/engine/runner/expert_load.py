"""Per-step expert routing counts of a mixture-of-experts model, read without a sync of their own."""

from __future__ import annotations

import torch
from torch import nn

from tessel.engine.models.layers.moe import FusedMoE


class ExpertLoadReader:
    """The MoE layers' on-device routing counters, copied to host memory once per step.

    ``snapshot`` is enqueued on the compute stream after the step's forward (a non-blocking copy
    into pinned memory, then the counters zeroed), so the values are valid once ``finish`` has
    waited for the step, a wait it does anyway; the copy belongs to exactly the step it follows.
    A dense model has no counters and every call is a no-op.
    """

    def __init__(self, model: nn.Module, device: torch.device, num_buffers: int = 2) -> None:
        self.counters: list[torch.Tensor] = [m.expert_load for m in model.modules() if isinstance(m, FusedMoE)]
        pinned = device.type == "cuda"
        shape = (len(self.counters), self.counters[0].numel()) if self.counters else (0, 0)
        self._host = [torch.zeros(shape, dtype=torch.long, pin_memory=pinned) for _ in range(num_buffers)]
        self.reset()  # memory profiling already ran forwards through the model

    def reset(self) -> None:
        """Drop what has been counted (warm-up and graph-capture forwards, a worker's steps)."""
        if self.counters:
            with torch.inference_mode():
                torch._foreach_zero_(self.counters)

    def snapshot(self, index: int) -> torch.Tensor | None:
        """Enqueue the copy of this step's counts ([MoE layers, experts]) into host buffer
        ``index``, then zero the counters; None for a dense model."""
        if not self.counters:
            return None
        host = self._host[index]
        host.copy_(torch.stack(self.counters), non_blocking=True)
        torch._foreach_zero_(self.counters)
        return host
