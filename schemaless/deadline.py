"""The deadline of a call, and the watchdog that keeps a blocked read to it.

``within(seconds)`` sets the deadline of everything a call does on servers (pool waits,
connects, pings, statements) for the current thread or task; a nested one never
extends an enclosing one.  The driver blocks in C while it reads a reply and takes
only whole-second timeouts per read, so ``Watchdog`` shuts down the socket of a reply
still awaited at its deadline: the read returns at once with a lost connection.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar

from . import forking

__all__ = ["Armed", "Watchdog", "current", "left", "within"]

#: Disarmed entries wait in the heap until their deadline (every call arms one, most
#: calls end long before it); past this many, and half the heap, it is rebuilt.
_COMPACT = 1024

_deadline: ContextVar[float | None] = ContextVar("schemaless_deadline", default=None)


@contextlib.contextmanager
def within(seconds: float | None) -> Iterator[None]:
    """Calls to servers in this block end ``seconds`` from now (None: no deadline,
    or the enclosing one)."""
    if seconds is None:
        yield
        return
    if seconds <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {seconds!r}")
    at = time.monotonic() + seconds
    outer = _deadline.get()
    token = _deadline.set(at if outer is None else min(outer, at))
    try:
        yield
    finally:
        _deadline.reset(token)


def current() -> float | None:
    """The deadline in force (``time.monotonic()`` seconds), or None."""
    return _deadline.get()


def left(at: float | None) -> float | None:
    """Seconds until ``at`` (negative once passed), or None without a deadline."""
    return None if at is None else at - time.monotonic()


class Armed:
    """One awaited reply: its socket, its deadline, and whether the watchdog fired."""

    __slots__ = ("at", "done", "fd", "fired")

    def __init__(self, fd: int, at: float) -> None:
        self.fd = fd
        self.at = at
        self.done = False
        self.fired = False


class Watchdog:
    """One daemon thread that shuts down the sockets of replies past their deadline."""

    def __init__(self) -> None:
        self._reset()
        forking.register(self)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Armed]] = []
        self._done = 0  # entries of the heap disarmed before their deadline
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def after_fork(self) -> None:
        """In a forked child: no thread, nothing armed."""
        self._reset()

    def arm(self, fd: int, at: float) -> Armed:
        """Watch the socket ``fd`` until ``disarm``; shut it down at ``at``."""
        armed = Armed(fd, at)
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._seq), armed))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="schemaless-watchdog", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is armed:
                self._cond.notify()
        return armed

    def disarm(self, armed: Armed) -> bool:
        """Stop watching; True if the socket was shut down (the connection is unusable).
        After this returns the watchdog never touches that socket again."""
        with self._cond:
            if not armed.done and not armed.fired:  # still in the heap: compact it
                self._done += 1
                if self._done > _COMPACT and 2 * self._done > len(self._heap):
                    self._heap = [entry for entry in self._heap if not entry[2].done]
                    heapq.heapify(self._heap)
                    self._done = 0
            armed.done = True
            return armed.fired

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                    self._done -= 1
                if not self._heap:
                    self._cond.wait()
                    continue
                at, _, armed = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                armed.fired = True
                _shut_down(armed.fd)


def _shut_down(fd: int) -> None:
    """Shut a socket down (both ways) without closing its descriptor: the owner's
    blocked read returns, and the owner closes it."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
