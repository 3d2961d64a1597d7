"""How the benchmark scripts end: the report printed, and written to ``--out`` when given."""

from __future__ import annotations

from pathlib import Path


def emit(lines: list[str], out: str | None) -> None:
    report = "\n".join(lines)
    print(report)
    if out:
        Path(out).write_text(report + "\n")
