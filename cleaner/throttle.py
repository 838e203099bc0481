"""Pacing: a token bucket for ``--rate``, and exponential backoff for unavailable servers."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["TokenBucket", "backoff_delays"]


class TokenBucket:
    """At most ``rate`` units per second on average, in bursts of up to ``burst``.

    ``reserve(n)`` takes ``n`` units at once (a batch may exceed the burst: the bucket
    goes into debt) and returns how long the caller must wait before using them.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(self.rate, 1.0)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()

    def set_rate(self, rate: float) -> None:
        """Change the rate from now on (units earned so far stay earned)."""
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self.rate = float(rate)

    def reserve(self, n: float) -> float:
        """Take ``n`` units; seconds to wait before they may be used (0: go now)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


def backoff_delays(base: float = 0.5, cap: float = 30.0) -> Iterator[float]:
    """Endless delays: ``base * 2**n`` capped at ``cap``, with up to 10 % jitter."""
    n = 0
    while True:
        delay = min(cap, base * 2**n)
        yield delay * random.uniform(0.9, 1.0)
        n = min(n + 1, 30)
