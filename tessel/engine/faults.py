"""Test-only fault injection at the model step: how tests make a step fail or hang."""

from __future__ import annotations

import time


class InjectedStepFault(RuntimeError):
    """Raised by a step when a test injected a fault (``StepFaults.inject``)."""


class StepFaults:
    """Faults the next model steps suffer, in order: one per step that runs the model."""

    def __init__(self) -> None:
        self._pending: list[tuple[str, float]] = []

    def inject(self, kind: str = "raise", seconds: float = 0.0) -> None:
        """The next step raises ``InjectedStepFault`` (``kind="raise"``), or blocks
        ``seconds`` first (``kind="stall"``, a stuck device)."""
        if kind not in ("raise", "stall"):
            raise ValueError(f"fault kind must be 'raise' or 'stall', got {kind!r}")
        self._pending.append((kind, seconds))

    def strike(self) -> None:
        """Called where a fault strikes: scheduled, blocks allocated, model not yet run."""
        if not self._pending:
            return
        kind, seconds = self._pending.pop(0)
        if kind == "stall":
            time.sleep(seconds)
            return
        raise InjectedStepFault("injected fault in the model step")
