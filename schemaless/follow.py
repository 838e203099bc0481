"""Following the map: a call's deadline, and running it again after a move.

A statement that meets a missing table (``TableMissing``) was routed by a map that has
changed since (a logical shard moved, an index was declared and the old fence dropped,
or an index was dropped and purged): ``follow_map`` refreshes the map and runs the call
again on the new one, or, while a move is under way, pauses and tries again.  The
datastore's calls (``Calls``) and the Cleaner's jobs (``Runtime.retry``) both use it.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import TypeVar

from .catalog import Topology
from .cluster import Cluster
from .deadline import current as current_deadline
from .deadline import within
from .errors import TableMissing

__all__ = ["Calls", "follow_map"]

T = TypeVar("T")

#: ``pause(topo, error, attempt)``: wait for the moves of ``topo`` (or raise ``error``).
Pause = Callable[[Topology, TableMissing, int], None]


def follow_map(
    cluster: Cluster,
    fn: Callable[[], T],
    pause: Pause,
    *,
    refresh: Callable[[], Topology] | None = None,
    changed: Callable[[TableMissing], None] | None = None,
) -> T:
    """``fn()``; when its tables are gone, refresh the map (``refresh``, default
    ``cluster.refresh``) and run it again if the routing changed (after ``changed``);
    if it did not but a move is recorded, ``pause`` and try again; else raise."""
    attempt = 0
    while True:
        seen = cluster.topology
        try:
            return fn()
        except TableMissing as exc:
            topo = refresh() if refresh is not None else cluster.refresh()
            if topo.routing != seen.routing:
                if changed is not None:
                    changed(exc)
                continue
            if not topo.moves:
                raise
            pause(topo, exc, attempt)
            attempt += 1


class Calls:
    """The deadline of each datastore call, and the map it follows."""

    def __init__(self, cluster: Cluster, timeout: float, move_wait: float) -> None:
        self.cluster = cluster
        #: Every call returns or raises within this many seconds (plus a small margin).
        self.timeout = timeout
        #: How long a call waits for a move under way before it fails.
        self.move_wait = move_wait

    def deadline(self, timeout: float | None = None) -> contextlib.AbstractContextManager[None]:
        """The deadline of one call (``timeout`` seconds, default the datastore's),
        which every server call in it keeps (``schemaless.deadline``)."""
        return within(self.timeout if timeout is None else timeout)

    def call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """``rerouted(fn)`` within one call's deadline."""
        with within(self.timeout if timeout is None else timeout):
            return self.rerouted(fn)

    def rerouted(self, fn: Callable[[], T]) -> T:
        """``fn()``, following the map (``follow_map``); while a move is under way,
        wait for it (up to ``move_wait``, and never past the call's deadline): writers
        pause, they do not fail."""
        return follow_map(self.cluster, fn, functools.partial(self._wait, time.monotonic()))

    def _wait(self, started: float, topo: Topology, exc: TableMissing, attempt: int) -> None:
        until = started + self.move_wait
        at = current_deadline()
        if at is not None:
            until = min(until, at)
        delay = min(0.01 * 2**attempt, 0.25)
        if time.monotonic() + delay >= until:
            raise exc
        time.sleep(delay)
