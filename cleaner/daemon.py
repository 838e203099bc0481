"""The Cleaner: backfill one index, or keep every index clean, pass after pass.

A pass is the recent-first check, a sweep of the index tables (all of it with
``full``, else a checkpointed slice) and the purge of old tombstones; the shards of a
server that is unavailable are left pending for the next pass (``Runtime.pending``,
docs/cleaner.md, "A server down costs only its shards").  Signals only
set flags (``Shutdown``); jobs stop after their current batch, so checkpoints are
always those of committed work.  A heartbeat with the figures goes to the catalog
every few seconds and at the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from typing import Any

from schemaless.catalog import IndexState, backfill_job, now_us
from schemaless.errors import SchemalessError
from schemaless.store import DataStore

from .backfill import Backfill
from .expire import Expiry
from .feedtrim import trim_feed
from .metrics import Figures, MetricsServer, figure_families, held_text
from .progress import Progress
from .purge import purge_tombstones
from .recent import RecentPass
from .repair import Repairer
from .runtime import Runtime, Shutdown, Stopped
from .sweep import Sweep
from .throttler import Throttler, ThrottleSettings

__all__ = ["Cleaner", "backfill_name"]

log = logging.getLogger("schemaless.cleaner")


def backfill_name(index: str, part: tuple[int, int] = (0, 1)) -> str:
    """The heartbeat name of a backfill: ``backfill:<index>``, ``:K/N`` for one part."""
    return backfill_job(index) + (f":{part[0] + 1}/{part[1]}" if part[1] > 1 else "")


class Cleaner:
    """One Cleaner process over a datastore (see the module docstring).

    ``run_once(now=...)`` and ``backfill(name)`` are plain calls (tests use them
    without signals); ``run_forever()`` loops until ``shutdown.request()``.
    """

    def __init__(
        self,
        store: DataStore,
        *,
        batch: int = 2000,
        burst: int | None = None,
        rate: float | None = None,
        interval: float = 10.0,
        tombstone_retention: float = 3600.0,
        feed_retention: float = 7 * 24 * 3600.0,
        fence_after: float = 60.0,
        sweep_budget: int | None = None,
        heartbeat_interval: float = 5.0,
        backoff_cap: float = 30.0,
        patience: float = 10.0,
        name: str | None = None,
        progress: Progress | None = None,
        shutdown: Shutdown | None = None,
        throttle: ThrottleSettings | None = None,
    ) -> None:
        self.figures = Figures()
        store.cluster.latency.enabled = False  # our batches are not the clients' writes
        self.throttler = _throttler(store, throttle, self.figures, rate, batch)
        self.rt = Runtime(
            store,
            figures=self.figures,
            shutdown=shutdown or Shutdown(),
            progress=progress or Progress(quiet=True),
            batch=batch,
            burst=burst,
            rate=None if self.throttler is not None else rate,
            throttler=self.throttler,
            backoff_cap=backoff_cap,
            patience=patience,
            on_tick=self._tick,
        )
        if self.throttler is not None:
            self.rt.progress.note = self.throttler.describe
        self.store = store
        self.interval = interval
        self.tombstone_retention = tombstone_retention
        self.feed_retention = feed_retention
        self.sweep_budget = sweep_budget if sweep_budget is not None else 10 * batch
        self.heartbeat_interval = heartbeat_interval
        self.name = name or f"cleaner:{socket.gethostname()}:{os.getpid()}"
        self._named = name is not None
        self.repairer = Repairer(store, self.figures, fence_after=fence_after)
        self.recent = RecentPass(self.rt, self.repairer, window=tombstone_retention)
        self.sweep = Sweep(self.rt, self.repairer)
        self.expiry = Expiry(self.rt)
        self.metrics: MetricsServer | None = None
        self._last_beat = 0.0
        self._started = time.monotonic()
        self._work_seconds: float | None = None  # the backfill's scan, without the grace
        self._index: str | None = None  # the index being backfilled
        self.part_done = False  # after backfill(): every shard of its part is done
        self.blocked = False  # after backfill(): values it cannot hold keep it building

    @property
    def shutdown(self) -> Shutdown:
        """The stop flags (``shutdown.request()`` stops after the current batch)."""
        return self.rt.shutdown

    # -- jobs ----------------------------------------------------------------------------

    def backfill(self, index: str, part: tuple[int, int] = (0, 1)) -> IndexState:
        """Backfill a building index; its state at the end (``ready`` when done).

        ``part=(k, n)``: only the logical shards with ``shard % n == k``, so that n
        processes (or machines) share one backfill; the last part to finish marks the
        index ready, the others return ``building`` with ``part_done`` True.
        """
        job_name = backfill_name(index, part)
        if not self._named:
            self.name = job_name
        self._index = index
        job = Backfill(self.rt, self.repairer, index, part)
        busy = f"another Cleaner is running {job_name}"
        try:
            with contextlib.ExitStack() as held:  # one process per backfill (part)
                catalog = self.store.cluster.catalog
                self.rt.retry(
                    "locking the backfill",
                    lambda: held.enter_context(catalog.lock(job_name, busy, wait=3)),
                )
                self._start_throttle()
                state = job.run()
        except Stopped:
            state = IndexState.BUILDING
        self.part_done, self.blocked = job.part_done, job.blocked
        self._work_seconds = job.seconds
        done = state == IndexState.READY or job.part_done
        self.figures.set(state="done" if done else "stopped", last_pass=now_us())
        return state

    def run_once(self, now: float | None = None, *, full: bool = True) -> dict[str, Any]:
        """One pass: recent changes, the sweep (whole if ``full``), the expiry of
        entities (``cleaner.expire``), the purge.

        ``now`` (Unix seconds) fixes the clock for the recent window, the expiry and
        the tombstone retention.  Returns the figures.
        """
        rt = self.rt
        now_s = time.time() if now is None else now
        rt.begin_pass()
        topo = rt.retry("reading the catalog", self.store.cluster.refresh)
        self._start_throttle()
        indexes = topo.maintained()
        rt.figures.set(state="recent")
        # recent changes look rows up by entity id: only in indexes that have the key
        # (a building index gets it at the end of its backfill)
        self.recent.run(topo, topo.ready(), int(now_s * 1e6))
        if not rt.stopping:
            rt.figures.set(state="sweep")
            self.sweep.run(topo, indexes, None if full else self.sweep_budget)
        if not rt.stopping and topo.expire_on is not None:
            rt.figures.set(state="expire")
            self.expiry.run(topo, now_s, None if full else self.sweep_budget)
        if not rt.stopping:
            rt.figures.set(state="purge")
            purge_tombstones(rt, topo, int((now_s - self.tombstone_retention) * 1e6))
        if not rt.stopping:
            trim_feed(rt, topo, int((now_s - self.feed_retention) * 1e6))
        if rt.stopping:
            raise Stopped()
        if rt.pending:
            log.warning("pass done but for %s: the next pass retries them", self.pending_text())
        if rt.pending:  # not a complete pass: ``last_pass`` stays
            rt.figures.set(state="pending")
        else:
            rt.figures.set(state="idle", last_pass=now_us())
        rt.figures.add(passes=1)
        self.heartbeat()
        return rt.figures.as_dict()

    def pending_text(self) -> str:
        """``logical shards 2, 5 (server unavailable: ...)``: what the last pass (or the
        backfill's last round) left pending, and the first reason."""
        pending = dict(self.rt.pending)
        if not pending:
            return ""
        shards = ", ".join(map(str, sorted(pending)))
        return f"logical shard(s) {shards} ({pending[min(pending)]})"

    def run_forever(self) -> None:
        """Pass after pass, ``interval`` seconds apart, until a stop is requested."""
        try:
            while not self.rt.stopping:
                try:
                    self.run_once(full=False)
                except SchemalessError as exc:  # e.g. an index purged mid-pass: next pass
                    log.error("pass failed: %s; next pass in %gs", exc, self.interval)
                    self.figures.set(state="error")
                self.rt.sleep(self.interval)
        except Stopped:
            pass
        self.figures.set(state="stopped")

    # -- reporting -----------------------------------------------------------------------

    def serve_metrics(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve Prometheus figures at ``http://host:port/metrics``; the port bound."""
        labels = {"name": self.name}
        self.metrics = MetricsServer(
            lambda: figure_families({**self.figures.as_dict(), **self._health()}, labels),
            port,
            host,
        )
        return self.metrics.port

    def _health(self) -> dict[str, int]:
        """The servers this client holds down now, and how often it marked one down."""
        states = list(self.store.health().values())
        return {
            "servers_down": sum(s.state == "down" for s in states),
            "server_downs": sum(s.downs for s in states),
        }

    def heartbeat(self) -> None:
        """Record the figures in the catalog now (a failure is logged, not raised)."""
        self._last_beat = time.monotonic()
        figures = self.figures.as_dict()
        figures.update(pid=os.getpid(), host=socket.gethostname())
        if self._index is not None:
            figures["index"] = self._index
        try:
            self.store.cluster.catalog.heartbeat(self.name, figures)
        except SchemalessError as exc:
            log.warning("heartbeat not recorded: %s", exc)

    def summary(self) -> str:
        """The figures of this run, for the end."""
        f = self.figures.as_dict()
        elapsed = time.monotonic() - self._started
        parts = [
            f"{self.name}: {f['state']} after {elapsed:.1f}s",
            f"rows checked {f['rows_checked']:,}",
            f"rows backfilled {f['rows_backfilled']:,}",
            f"rows upserted {f['rows_upserted']:,}",
            f"orphans deleted {f['orphans_deleted']:,}",
            f"fenced {f['fenced']:,}",
            f"deferred {f['deferred']:,}",
            f"tombstones purged {f['purged']:,}",
            f"expired purged {f['expired_purged']:,}",
            f"unindexable {f['unindexable']:,}",
            f"corrupt {f['corrupt']:,}",
        ]
        if f["rows_deferred"]:
            parts.insert(3, f"rows deferred (a server down) {f['rows_deferred']:,}")
        seconds = self._work_seconds or elapsed
        if f["rows_backfilled"] and seconds > 0:
            parts.append(f"{f['rows_backfilled'] / seconds:,.0f} rows/s")
        held = held_text(f)
        return ", ".join([*parts, held] if held else parts)

    def close(self) -> None:
        """Final heartbeat, progress line, metrics endpoint; the store is the caller's."""
        if self.throttler is not None:
            self.throttler.close()
        self.rt.progress.close()
        self.heartbeat()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def _start_throttle(self) -> None:
        """Baseline and threads of the throttle, once, before the first batch."""
        throttler = self.throttler
        if throttler is not None:
            self.rt.retry("starting the throttle", lambda: throttler.start(self.name))

    def _tick(self) -> None:
        self.rt.progress.show()
        if time.monotonic() - self._last_beat >= self.heartbeat_interval:
            self.heartbeat()


def _throttler(
    store: DataStore,
    throttle: ThrottleSettings | None,
    figures: Figures,
    rate: float | None,
    batch: int,
) -> Throttler | None:
    """The adaptive throttle, if asked for: its bucket holds a batch (a round pays up
    to a burst per server, and one that held less would forfeit the time each round's
    work takes)."""
    if throttle is None:
        return None
    return Throttler(store, throttle, figures=figures, cap=rate, batch=batch)
