"""Forked children (pre-fork servers, ``multiprocessing`` with ``fork``).

A child inherits the parent's open connections, which are the parent's sessions, and
locks that a parent thread may have held at the fork, but none of its threads.  Every
object that holds such things registers here; in the child, its ``after_fork`` runs
before anything else can use it.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["Forkable", "detach", "register"]


class Forkable(Protocol):
    def after_fork(self) -> None:
        """Start afresh in a forked child (its locks, connections and threads)."""


_registered: weakref.WeakSet[Forkable] = weakref.WeakSet()


def register(obj: Forkable) -> None:
    """Call ``obj.after_fork()`` in every child forked from now on."""
    _registered.add(obj)


def detach(fd: int) -> None:
    """Point ``fd`` at /dev/null in this process: whatever this process still sends on
    it (a driver's goodbye when the object is freed) never reaches the session that
    the parent goes on using."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _in_child() -> None:
    for obj in list(_registered):
        obj.after_fork()


os.register_at_fork(after_in_child=_in_child)
