"""Running Prometheus's ``promtool`` (Debian's ``prometheus`` package; ``.ci/run`` installs it)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed: apt-get install prometheus (.ci/run does it in CI)",
)


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` with ``stdin``; its output (stdout and stderr) in ``.stdout``."""
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args],
        input=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )
