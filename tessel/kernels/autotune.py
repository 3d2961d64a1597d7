"""Whether the kernels autotune: one switch for every autotuned kernel."""

from __future__ import annotations

import os


def autotune_enabled() -> bool:
    """Autotune on a real GPU unless TESSEL_AUTOTUNE=0; never under the interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return os.environ.get("TESSEL_AUTOTUNE", "1") != "0"
