"""The Cleaner's CPU priority: below live traffic on a machine it shares.

``os.nice`` only ranks a task against the others of its scheduling group.  With the
kernel's autogroups (``CONFIG_SCHED_AUTOGROUP``, on by default in most distributions'
kernels) every session is a group of its own, and the groups share the CPUs at equal
weight whatever the nice of their tasks: a Cleaner that leads its own session (a
systemd service, ``setsid cleaner``, each worker of ``--jobs N``) would compete with
database servers and live clients at full weight, its ``--nice`` ignored.  Such a
Cleaner also gives its session's autogroup its own nice.  One that does not lead its
session shares the group with its caller (a shell, a script) and leaves it alone.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["AUTOGROUP", "lower_priority"]

log = logging.getLogger("schemaless.cleaner")

AUTOGROUP = Path("/proc/self/autogroup")


def lower_priority(increment: int, autogroup: Path = AUTOGROUP) -> int | None:
    """Add ``increment`` to this process's nice; if it leads its session, set its
    autogroup's nice to the result too.  Returns the autogroup's nice if set, else None
    (not a session leader, nice 0, or a kernel without autogroups)."""
    nice = os.nice(increment)
    if nice <= 0 or os.getsid(0) != os.getpid():
        return None
    try:
        autogroup.write_text(f"{nice}\n")
    except OSError as exc:  # no autogroups in this kernel, or not allowed
        log.debug("priority: autogroup nice not set: %s", exc)
        return None
    return nice
