"""Failpoints: named places in the write protocol, the Cleaner and shard moves where a
test can make the process raise, sleep or die.

Inactive unless named, either by the environment (read once at import)::

    SCHEMALESS_FAILPOINTS="put.after_index_rows=kill,cleaner.before_delete=sleep(0.5)"

or by a test in the same process (``failpoints.set(name, action)``).  Actions:
``raise`` (``FailpointError``), ``sleep(SECONDS)``, ``kill`` (SIGKILL to this
process), or any callable.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable

__all__ = ["FailpointError", "clear", "hit", "set"]

Action = Callable[[], None]

_SLEEP = re.compile(r"sleep\(([0-9.]+)\)\Z")
_active: dict[str, Action] = {}


class FailpointError(Exception):
    """Raised by a failpoint whose action is ``raise`` (never caught by the library)."""


def _parse(name: str, spec: str) -> Action:
    if spec == "raise":

        def fail() -> None:
            raise FailpointError(name)

        return fail
    if spec == "kill":
        return lambda: os.kill(os.getpid(), signal.SIGKILL)
    match = _SLEEP.match(spec)
    if match:
        seconds = float(match.group(1))
        return lambda: time.sleep(seconds)
    raise ValueError(f"unknown failpoint action {spec!r} for {name!r}")


def set(name: str, action: str | Action) -> None:
    """Activate a failpoint."""
    _active[name] = _parse(name, action) if isinstance(action, str) else action


def clear(name: str | None = None) -> None:
    """Deactivate one failpoint, or all."""
    if name is None:
        _active.clear()
    else:
        _active.pop(name, None)


def hit(name: str) -> None:
    """Run the failpoint's action if it is active (a dict lookup otherwise)."""
    action = _active.get(name)
    if action is not None:
        action()


for _item in filter(None, os.environ.get("SCHEMALESS_FAILPOINTS", "").split(",")):
    _name, _, _spec = _item.partition("=")
    set(_name.strip(), _spec.strip())
