"""What a client believes about one server: healthy, suspect, or down since a time.

A server that let a call wait out a timeout is marked **down**: calls that need it fail
at once (``ShardUnavailable``, "marked down since ...") instead of each waiting a
timeout of its own, while one probe (``Server``'s background thread) tries it again
after a short, growing backoff; the first success clears the mark.  A server that lost
a connection, or whose stale connection did not answer a quick ping, is **suspect**:
its idle connections are dropped (they are likely dead too) but calls still try it,
since a refused or lost connection costs nothing to find out again.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from .errors import ShardUnavailable

__all__ = ["DOWN", "HEALTHY", "SUSPECT", "Health", "HealthState"]

log = logging.getLogger(__name__)

HEALTHY, SUSPECT, DOWN = "healthy", "suspect", "down"


@dataclass(frozen=True)
class HealthState:
    """A snapshot: the state, since when (Unix time; None when healthy), the error that
    marked it, and how many times this client has marked the server down so far."""

    state: str
    since: float | None
    reason: str
    downs: int


class Health:
    """The health of one server, shared by every thread of a client."""

    def __init__(self, name: str, *, first_probe: float = 0.05, max_probe: float = 0.5) -> None:
        self.name = name
        self.first_probe = first_probe
        self.max_probe = max_probe
        self._lock = threading.Lock()
        self._state = HealthState(HEALTHY, None, "", 0)
        self._probe_delay = first_probe

    @property
    def state(self) -> HealthState:
        return self._state

    def check(self) -> None:
        """Raise ``ShardUnavailable`` at once if the server is marked down."""
        state = self._state
        if state.state == DOWN:
            assert state.since is not None
            raise ShardUnavailable(
                f"{self.name}: marked down since {_clock(state.since)} "
                f"({time.time() - state.since:.1f}s ago) after: {state.reason}; "
                "a probe checks it in the background"
            )

    def suspect(self, reason: str) -> bool:
        """Mark a healthy server suspect; True if this changed its state."""
        with self._lock:
            if self._state.state != HEALTHY:
                return False
            self._state = HealthState(SUSPECT, time.time(), reason, self._state.downs)
        log.info("%s suspect: %s", self.name, reason)
        return True

    def down(self, reason: str) -> bool:
        """Mark the server down; True if it was not already (the caller starts the probe)."""
        with self._lock:
            if self._state.state == DOWN:
                return False
            self._state = HealthState(DOWN, time.time(), reason, self._state.downs + 1)
            self._probe_delay = self.first_probe
        log.warning("%s marked down: %s", self.name, reason)
        return True

    def up(self) -> None:
        """The server answered: clear any mark."""
        if self._state.state == HEALTHY:  # the common case, without the lock
            return
        with self._lock:
            old = self._state
            if old.state == HEALTHY:
                return
            self._state = HealthState(HEALTHY, None, "", old.downs)
        assert old.since is not None
        level = logging.WARNING if old.state == DOWN else logging.INFO  # as it was marked
        log.log(
            level, "%s no longer %s, after %.1fs", self.name, old.state, time.time() - old.since
        )

    def next_probe(self) -> float:
        """Seconds to wait before the next probe: doubling up to ``max_probe``."""
        with self._lock:
            delay = self._probe_delay
            self._probe_delay = min(self.max_probe, delay * 2)
        return delay

    def reset(self) -> None:
        """Forget the state (in a forked child, which has no probe thread)."""
        self._lock = threading.Lock()
        self._state = HealthState(HEALTHY, None, "", 0)


def _clock(when: float) -> str:
    """A wall-clock time for messages (UTC, with milliseconds)."""
    return time.strftime("%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1000):03d}Z"
