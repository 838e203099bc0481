"""Where a results file comes from: its date, the commit and the command that made it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["AT_START", "ROOT", "command_line", "commit", "load_average", "provenance"]

ROOT = Path(__file__).resolve().parent.parent


def commit(*paths: str) -> str:
    """``git rev-parse --short HEAD``, with ``+dirty`` if the tree (or ``paths`` in it)
    has changes; ``unknown`` outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", *paths)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as a user types it: ``python -m bench.timeline --scale 0.05``."""
    argv = list(sys.argv if argv is None else argv)
    path = Path(argv[0]).resolve()
    if path.suffix != ".py" or not path.is_relative_to(ROOT):
        return shlex.join(["python", *argv])
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__main__" else rel.parts
    return shlex.join(["python", "-m", ".".join(parts), *argv[1:]])


def provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Date (UTC), commit and command line now."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "command": command_line(argv),
    }


def load_average() -> list[float]:
    """The machine's load average over 1, 5 and 15 minutes."""
    return [round(x, 2) for x in os.getloadavg()]


#: this process's provenance, taken when the bench starts: the code it loaded, not
#: what the tree holds by the time the results are written
AT_START = provenance()
