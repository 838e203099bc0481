"""The Cleaner's CPU priority (cleaner/priority.py), in processes of their own: a
session leader's autogroup takes its nice, anything else leaves its caller's alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from schemaless.cleaner.priority import AUTOGROUP

CHILD = """
import json, os, sys
from pathlib import Path
from schemaless.cleaner.priority import AUTOGROUP, lower_priority
def group():  # None: no autogroups, or the init's session (whose group prints nothing)
    words = AUTOGROUP.read_text().split() if AUTOGROUP.exists() else []
    return words[-1] if words else None
before, start = group(), os.nice(0)
out = lower_priority(int(sys.argv[1]))
print(json.dumps(
    {"returned": out, "start": start, "nice": os.nice(0), "before": before, "after": group()}
))
"""

HAS_AUTOGROUP = AUTOGROUP.exists()


def _child(increment: int, *, session: bool, nice: int = 0) -> dict[str, object]:
    cmd = [sys.executable, "-c", CHILD, str(increment)]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, start_new_session=session, timeout=30
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def _added(got: dict[str, object], increment: int) -> int:
    """The nice the child should have (this process may be niced already: a test that
    ran the cleaner command in-process niced it)."""
    start = got["start"]
    assert isinstance(start, int)
    return min(19, start + increment)


def test_a_session_leader_gives_its_autogroup_its_nice() -> None:
    got = _child(5, session=True)
    nice = _added(got, 5)
    assert got["nice"] == nice
    if HAS_AUTOGROUP:  # a kernel with autogroups: the session's group is niced too
        assert (got["before"], got["returned"], got["after"]) == ("0", nice, str(nice))
    else:
        assert got["returned"] is None


def test_a_worker_that_inherited_its_nice_sets_its_new_sessions_group() -> None:
    # --jobs N: the supervisor is niced, its workers run --nice 0 in sessions of their own
    got = _child(0, session=True, nice=7)
    nice = got["start"]
    assert isinstance(nice, int) and nice >= 7 and got["nice"] == nice
    assert got["returned"] == (nice if HAS_AUTOGROUP else None)
    if HAS_AUTOGROUP:
        assert got["after"] == str(nice)


def test_a_cleaner_in_its_callers_session_leaves_the_callers_group_alone() -> None:
    got = _child(5, session=False)
    assert got["nice"] == _added(got, 5) and got["returned"] is None
    assert got["after"] == got["before"]


def test_nice_zero_leaves_the_group_alone() -> None:
    got = _child(0, session=True)
    if got["start"] == 0:  # not niced by now: nothing to give the group
        assert (got["nice"], got["returned"]) == (0, None)
        assert got["after"] == got["before"]
    else:  # niced already (see _added): the group takes it
        assert got["returned"] == (got["start"] if HAS_AUTOGROUP else None)


def test_a_kernel_without_autogroups_is_no_error(tmp_path: Path) -> None:
    code = (
        "import os; from pathlib import Path; from schemaless.cleaner.priority import"
        f" lower_priority; print(lower_priority(3, Path({str(tmp_path / 'none' / 'x')!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
        timeout=30,
    )
    assert out.stdout.strip() == "None"
