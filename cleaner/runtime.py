"""What every Cleaner job shares: the store, its knobs and figures, stop flags, pacing.

``Shutdown`` holds the signal flags (handlers only set them: the first SIGTERM/SIGINT
asks to stop after the current batch, the second restores the default handler and
re-raises the signal).  ``Runtime.retry`` backs off while a server is unavailable, and
follows the map when a logical shard moves.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar

from schemaless.catalog import Topology
from schemaless.errors import TableMissing, TransientError
from schemaless.follow import follow_map
from schemaless.store import DataStore

from .metrics import Figures
from .progress import Progress
from .throttle import TokenBucket, backoff_delays
from .throttler import Throttler

__all__ = ["Runtime", "Shutdown", "Stopped"]

log = logging.getLogger("schemaless.cleaner")

T = TypeVar("T")

_SLICE = 0.1  # seconds: how quickly a sleeping job notices a stop request


class Stopped(Exception):
    """A stop was requested while a job was waiting (not an error: exit 0)."""


class Shutdown:
    """Stop flags, set by signal handlers or by ``request()``."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def request(self, signum: int | None = None) -> None:
        """Ask every job to stop after its current batch."""
        self.requested = True
        self.signum = signum

    def install(self) -> None:
        """Handle SIGTERM and SIGINT (main thread only)."""
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put back the handlers that were there before ``install``."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # the second signal: stop at once, the default way
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.request(signum)


@dataclass
class Runtime:
    """The store, the knobs and the shared state of one Cleaner process."""

    store: DataStore
    figures: Figures = field(default_factory=Figures)
    shutdown: Shutdown = field(default_factory=Shutdown)
    progress: Progress = field(default_factory=lambda: Progress(quiet=True))
    batch: int = 2000
    #: a backfill's upserts go in transactions of at most this many index rows per
    #: server, each paid to the throttle before it is sent (None: a batch's at once)
    burst: int | None = None
    rate: float | None = None  # rows per second, None: unlimited
    #: the adaptive throttle (it applies ``--rate`` itself: then ``rate`` is None)
    throttler: Throttler | None = None
    backoff_cap: float = 30.0
    #: Called between batches and while waiting (heartbeat, progress); must not raise.
    on_tick: Callable[[], None] = lambda: None
    #: Set when one of a job's threads failed: the others stop after their batch.
    halt: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _bucket: TokenBucket | None = field(default=None, init=False, repr=False)
    _tick_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.rate:
            self._bucket = TokenBucket(self.rate, burst=max(self.rate, float(self.batch)))

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested (or a job's worker failed: ``halt``)."""
        return self.shutdown.requested or self.halt.is_set()

    def tick(self) -> None:
        """Run the tick hook unless another thread is already running it."""
        if self._tick_lock.acquire(blocking=False):
            try:
                self.on_tick()
            finally:
                self._tick_lock.release()

    def sleep(self, seconds: float) -> None:
        """Wait, ticking; raise ``Stopped`` as soon as a stop is requested."""
        deadline = time.monotonic() + seconds
        while True:
            if self.stopping:
                raise Stopped()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(_SLICE, left))
            self.tick()

    def throttle(self, rows: int) -> None:
        """Pay for ``rows`` with the throttle or the rate limit (if any); while the
        throttle pauses, wait (``Stopped`` if a stop is requested meanwhile)."""
        if rows <= 0:
            return
        wait = 0.0
        if self.throttler is not None:
            while (reserved := self.throttler.reserve(rows)) is None:
                self.sleep(_SLICE)
            wait = reserved
        elif self._bucket is not None:
            wait = self._bucket.reserve(rows)
        if wait > 0:
            self.sleep(wait)

    def rest(self, took: float) -> None:
        """After ``took`` seconds of work the rows do not pace (a table's ``by_entity``
        key): with the throttle on, rest as long, so that work keeps a server busy at
        most half the time, and on while the throttle pauses (``Stopped`` if a stop is
        requested meanwhile)."""
        if self.throttler is None:
            return
        self.sleep(took)
        while self.throttler.aimd.paused:
            self.sleep(_SLICE)

    def retry(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, again and again while a server is unavailable (see ``_backoff``) or
        while its tables are gone because a logical shard moved (at once, on the new
        map) or is moving (for as long as the move is recorded); ``Stopped`` if a stop
        is requested meanwhile.  To follow a move, ``fn`` reads the map afresh
        (``cluster.current()``)."""
        cluster = self.store.cluster
        moving = backoff_delays(base=0.05, cap=min(1.0, self.backoff_cap))

        def pause(topo: Topology, exc: TableMissing, attempt: int) -> None:
            if not attempt:
                shards = ", ".join(map(str, sorted(topo.moves)))
                log.warning(
                    "%s: %s; waiting for the move of logical shard(s) %s", what, exc, shards
                )
            self.sleep(next(moving))

        def changed(exc: TableMissing) -> None:
            log.info("%s: %s; the map changed, carrying on with the new one", what, exc)

        return follow_map(
            cluster,
            lambda: self._backoff(what, fn),
            pause,
            refresh=lambda: self._backoff("reading the catalog", cluster.refresh),
            changed=changed,
        )

    def _backoff(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, again and again while a server is unavailable (exponential backoff,
        capped at ``backoff_cap``)."""
        delays = backoff_delays(cap=self.backoff_cap)
        failing = False
        while True:
            try:
                result = fn()
            except TransientError as exc:  # OutcomeUnknown too: every batch is idempotent
                delay = next(delays)
                self.figures.add(backoffs=1)
                log.warning("%s: %s; retrying in %.3gs", what, exc, delay)
                failing = True
                self.sleep(delay)
                continue
            if failing:
                log.info("%s: server available again, carrying on", what)
            return result
