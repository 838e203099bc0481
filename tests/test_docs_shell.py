"""The docs' command lines are valid shell, as a reader pastes them (an unquoted
``str(255)`` was a bash syntax error in the README)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_CONSOLE = re.compile(r"```console\n(.*?)```", re.S)


def _commands(doc: Path) -> list[str]:
    """The `schemaless` and `cleaner` lines of a doc's console blocks."""
    lines = [
        line.removeprefix("$ ").strip()
        for block in _CONSOLE.findall(doc.read_text())
        for line in block.splitlines()
    ]
    return [
        line for line in lines if line == "cleaner" or line.startswith(("schemaless ", "cleaner "))
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_command_line_parses_in_bash(doc: Path) -> None:
    for line in _commands(doc):
        checked = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True)
        assert checked.returncode == 0, f"{doc.name}: {line}\n{checked.stderr}"
