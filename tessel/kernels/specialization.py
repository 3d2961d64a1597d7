"""Integer kernel arguments that change from step to step, kept out of Triton's specialization.

Triton compiles a separate binary for an integer argument equal to 1 or divisible by 16. For an
argument that follows the step (a block table's width, a decode plan's offsets) each new class
is a compile, a second or more, paid inside the first step that meets it: in a fresh process,
in the middle of serving. These arguments only offset scalar loads, so the specialization buys
nothing. ``TESSEL_SPECIALIZE_STEP_INTS=1`` restores it (benchmarks/cold_start.py compares).
"""

from __future__ import annotations

import os

SPECIALIZE_STEP_INTS = os.environ.get("TESSEL_SPECIALIZE_STEP_INTS", "0") == "1"


def step_varying(*names: str) -> list[str]:
    """``do_not_specialize`` for a kernel whose arguments ``names`` vary with the step."""
    return [] if SPECIALIZE_STEP_INTS else list(names)
