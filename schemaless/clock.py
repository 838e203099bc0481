"""Versions for blind writes: a hybrid logical clock.

A blind ``put`` cannot read the stored version without an extra round trip, so it
picks ``V = max(now_us, last + 1)``.  If the stored version is already >= V (another
client's clock runs ahead), the write is refused by the server, the clock observes
the stored version and the write is made again with a larger V.
"""

from __future__ import annotations

import threading
import time

from . import forking

__all__ = ["VersionClock"]


class VersionClock:
    """Strictly increasing 64-bit versions, close to wall-clock microseconds."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()
        forking.register(self)

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (a parent thread may have held it)."""
        self._lock = threading.Lock()

    def next(self) -> int:
        """A version larger than any returned or observed before."""
        now = time.time_ns() // 1000
        with self._lock:
            self._last = max(now, self._last + 1)
            return self._last

    def observe(self, version: int) -> None:
        """Remember a version seen in storage so later versions exceed it."""
        with self._lock:
            self._last = max(self._last, version)
