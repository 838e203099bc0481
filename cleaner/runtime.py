"""What every Cleaner job shares: the store, its knobs and figures, stop flags, pacing.

``Shutdown`` holds the signal flags (handlers only set them: the first SIGTERM/SIGINT
asks to stop after the current batch, the second restores the default handler and
re-raises the signal).  ``Runtime.retry`` backs off while a server is unavailable, and
follows the map when a logical shard moves.  Given a logical shard, it waits at most
``patience`` seconds, then records the shard in ``pending`` and raises
``ShardPending``: the job moves on to its next shard, and a later pass (or round)
finishes this one.  ``begin_pass`` asks every server for ``SELECT 1``: the shards of
those that do not answer (``down``) are left pending at once, and the jobs leave out
the work that would need them.
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
from schemaless.hashing import shard_of
from schemaless.scatter import unreachable_only
from schemaless.store import DataStore

from .metrics import Figures
from .progress import Progress
from .throttle import TokenBucket, backoff_delays
from .throttler import Throttler

__all__ = ["Runtime", "ShardPending", "Shutdown", "Stopped"]

log = logging.getLogger("schemaless.cleaner")

T = TypeVar("T")

_SLICE = 0.1  # seconds: how quickly a sleeping job notices a stop request
_STILL_MOVING = 60  # a wait for a move says again what ends it every this many tries (~1 min)


class Stopped(Exception):
    """A stop was requested while a job was waiting (not an error: exit 0)."""


class ShardPending(Exception):
    """A logical shard's work needs a server that stayed unavailable: the job leaves the
    shard for a later pass (recorded in ``Runtime.pending``)."""

    def __init__(self, shard: int, cause: object) -> None:
        super().__init__(f"logical shard {shard} left pending: {cause}")
        self.shard = shard


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
    #: seconds a logical shard's work waits for an unavailable server before the shard
    #: is left pending
    patience: float = 10.0
    #: logical shard -> why it was left pending, since ``begin_pass``
    pending: dict[int, str] = field(default_factory=dict, init=False)
    #: server id -> why it did not answer ``begin_pass``'s ``SELECT 1``
    down: dict[int, str] = field(default_factory=dict, init=False)
    #: Called between batches and while waiting (heartbeat, progress); must not raise.
    on_tick: Callable[[], None] = lambda: None
    #: Set when one of a job's threads failed: the others stop after their batch.
    halt: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _bucket: TokenBucket | None = field(default=None, init=False, repr=False)
    _tick_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _pending_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

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

    def begin_pass(self) -> None:
        """Forget the shards left pending and find the servers that are ``down`` now:
        a new pass tries every shard again but theirs."""
        self.pending.clear()
        self.figures.set(pending_shards=0)
        cluster = self.store.cluster
        topo = cluster.current()
        found = cluster.scatter(topo, dict.fromkeys(topo.servers, 0), _select_one, partial=True)
        unreachable_only(found.errors)
        self.down = {sid: str(exc) for sid, exc in found.errors.items()}
        for sid, why in sorted(self.down.items()):
            log.warning("%s: %s; its logical shards are left pending", topo.servers[sid], why)

    def unavailable(self, shard: int) -> bool:
        """Whether a logical shard's server was ``down`` at the start of the pass (the
        shard is then recorded as pending)."""
        why = self.down.get(self.store.cluster.current().shard_servers[shard])
        if why is not None:
            self.skipped(shard, why)
        return why is not None

    def on_down(self, topo: Topology, entity_id: bytes) -> bool:
        """Whether an entity is stored on a server that is ``down``."""
        return (
            bool(self.down) and topo.shard_servers[shard_of(entity_id, topo.n_shards)] in self.down
        )

    def skipped(self, shard: int, why: str) -> bool:
        """Record a shard as pending (its work left out what needs a server that is
        ``down``); whether it was not yet."""
        with self._pending_lock:
            if shard in self.pending:
                return False
            self.pending[shard] = why
            self.figures.set(pending_shards=len(self.pending))
        return True

    def retry(self, what: str, fn: Callable[[], T], shard: int | None = None) -> T:
        """``fn()``, again and again while a server is unavailable (see ``_backoff``) or
        while its tables are gone because a logical shard moved (at once, on the new
        map) or is moving (for as long as the move is recorded); ``Stopped`` if a stop
        is requested meanwhile.  To follow a move, ``fn`` reads the map afresh
        (``cluster.current()``).  ``shard``: the logical shard the work is for, left
        pending after ``patience`` (``ShardPending``)."""
        cluster = self.store.cluster
        moving = backoff_delays(base=0.05, cap=min(1.0, self.backoff_cap))

        def pause(topo: Topology, exc: TableMissing, attempt: int) -> None:
            if not attempt:
                shards = ", ".join(map(str, sorted(topo.moves)))
                log.warning(
                    "%s: %s; waiting for the move of logical shard(s) %s", what, exc, shards
                )
            elif not attempt % _STILL_MOVING:  # a mover may have died: say what ends it
                log.warning("%s: still waiting: %s", what, "; ".join(topo.move_hints()))
            self.sleep(next(moving))

        def changed(exc: TableMissing) -> None:
            log.info("%s: %s; the map changed, carrying on with the new one", what, exc)

        return follow_map(
            cluster,
            lambda: self._backoff(what, fn, shard),
            pause,
            refresh=lambda: self._backoff("reading the catalog", cluster.refresh),
            changed=changed,
        )

    def _backoff(self, what: str, fn: Callable[[], T], shard: int | None = None) -> T:
        """``fn()``, again and again while a server is unavailable (exponential backoff,
        capped at ``backoff_cap``; for a ``shard``, until ``patience`` runs out)."""
        delays = backoff_delays(cap=self.backoff_cap)
        failing = False
        give_up = time.monotonic() + self.patience
        while True:
            try:
                result = fn()
            except TransientError as exc:  # OutcomeUnknown too: every batch is idempotent
                if shard is not None and time.monotonic() >= give_up:
                    self.leave(what, shard, exc)
                    raise ShardPending(shard, exc) from exc
                delay = next(delays)
                if shard is not None:
                    delay = max(0.0, min(delay, give_up - time.monotonic()))
                self.figures.add(backoffs=1)
                log.warning("%s: %s; retrying in %.3gs", what, exc, delay)
                failing = True
                self.sleep(delay)
                continue
            if failing:
                log.info("%s: server available again, carrying on", what)
            return result

    def leave(self, what: str, shard: int, exc: BaseException) -> None:
        """Record a shard left pending after its work failed (logged)."""
        if self.skipped(shard, str(exc)):
            log.warning("%s: %s; logical shard %d left pending", what, exc, shard)


def _select_one(_: object) -> tuple[str, tuple[()]]:
    return "SELECT 1", ()
