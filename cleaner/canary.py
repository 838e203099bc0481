"""Canary probes: a point read and a one-row write timed on one server, every few
hundred milliseconds, from a process of its own (cleaner/prober.py).

The write goes to the Cleaner's own row of ``<prefix>_canary.canary`` (created by the
first probe; the Cleaner's grants allow it), so it pays what a live write pays: a row
lock, a commit.  The same round trip reads the status variables that ``--max-load``
and ``--critical-load`` watch, and, for a server with replicas, their lag.  A probe
still running counts as a sample of its age so far: a server that stopped answering
(or a row lock held) shows at once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from schemaless.catalog import now_us
from schemaless.connection import Server
from schemaless.errors import PermissionDenied, SchemalessError, TableMissing
from schemaless.latency import percentile
from schemaless.names import quote

__all__ = ["Canary", "Sample"]

log = logging.getLogger("schemaless.cleaner")

#: seconds a canary write waits for a row lock before it fails (and counts as slow)
LOCK_WAIT = 1
#: probes kept per server (the window is shorter: see ``Canary.latency_ms``)
KEPT = 64
#: probes a window needs for a signal: it is at most their second slowest, so two of
#: three must be slow (a window of one or two would be one probe's word)
LEAST = 3


@dataclass(frozen=True)
class Sample:
    """One probe: when it began and ended (monotonic seconds), the status variables
    and replica lag it read (None: not read)."""

    started: float
    ended: float
    status: dict[str, int] | None = None
    lag: float | None = None


class Canary:
    """Probes one server: ``probe`` here, or ``measure`` in the probe process
    (cleaner/prober.py), whose samples ``began`` and ``record`` count here."""

    def __init__(
        self,
        server: Server,
        db: str,
        name: str,
        status_vars: Sequence[str] = (),
        replicas: Sequence[Server] = (),
    ) -> None:
        self.server = server
        self.name = name
        self.table = quote(db, "canary")
        self._db = db
        self._status_vars = list(status_vars)
        self._replicas = list(replicas)
        self._samples: deque[tuple[float, float]] = deque(maxlen=KEPT)  # (end, seconds)
        self._started: float | None = None  # the probe in flight
        self.probes = 0  # recorded so far
        self.status: dict[str, int] = {}  # lower-case variable name -> value
        self.lag: float | None = None
        self.baseline_ms = 0.0  # set by the throttle before the first batch
        self.writes = True  # False: the table cannot be made, reads only
        self._ready = False  # the table is there (or cannot be made)
        self._unready = False  # setting it up failed (and was logged)

    def setup(self) -> None:
        """Create the canary table if needed; reads only if that is not allowed (the
        server unavailable: try again at the next probe)."""
        try:
            self.server.run(
                f"CREATE DATABASE IF NOT EXISTS {quote(self._db)};"
                f" CREATE TABLE IF NOT EXISTS {self.table} ("
                " `name` VARCHAR(128) NOT NULL PRIMARY KEY,"
                " `probes` BIGINT UNSIGNED NOT NULL,"
                " `updated` BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
            )
        except (PermissionDenied, TableMissing) as exc:
            self.writes = False
            log.warning("throttle: canary on %s reads only: %s", self.server.name, exc)
        except SchemalessError as exc:  # said once: it is tried again every probe
            level = logging.DEBUG if self._unready else logging.WARNING
            self._unready = True
            log.log(level, "throttle: canary on %s not set up yet: %s", self.server.name, exc)
            return
        self._ready = True

    def probe(self) -> float:
        """One probe, recorded here; its seconds (a failed probe counts as slow as it
        was)."""
        self.began(time.monotonic())
        sample = self.measure()
        self.record(sample)
        return sample.ended - sample.started

    def measure(self) -> Sample:
        """Run one probe and time it; nothing recorded (``record`` does)."""
        if not self._ready:
            self.setup()
        sql, params = self._sql()
        started = time.monotonic()
        out = None
        try:
            out = self.server.run(sql, params)
        except SchemalessError as exc:
            log.debug("throttle: canary on %s failed: %s", self.server.name, exc)
        ended = time.monotonic()
        status = None
        if out is not None and self._status_vars:
            status = {str(k).lower(): int(v) for k, v in out[-1]}
        return Sample(started, ended, status, self._lag() if self._replicas else None)

    def began(self, started: float) -> None:
        """A probe is in flight since ``started`` (monotonic seconds)."""
        self._started = started

    def record(self, sample: Sample) -> None:
        """Count a probe's sample: its latency, the status variables, the lag."""
        self._samples.append((sample.ended, sample.ended - sample.started))
        self._started = None
        self.probes += 1
        if sample.status is not None:
            self.status = sample.status
        if self._replicas:
            self.lag = sample.lag

    def _sql(self) -> tuple[str, list[object]]:
        stmts: list[str] = []
        params: list[object] = []
        if self.writes:
            stmts.append(f"SELECT `probes` FROM {self.table} WHERE `name` = %s")
            stmts.append(
                f"SET STATEMENT innodb_lock_wait_timeout = {LOCK_WAIT} FOR"
                f" INSERT INTO {self.table} (`name`, `probes`, `updated`) VALUES (%s, 1, %s)"
                " ON DUPLICATE KEY UPDATE `probes` = `probes` + 1, `updated` = VALUES(`updated`)"
            )
            params += [self.name, self.name, now_us()]
        else:
            stmts.append("SELECT 1")
        if self._status_vars:
            marks = ", ".join(["%s"] * len(self._status_vars))
            stmts.append(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({marks})")
            params += self._status_vars
        return "; ".join(stmts), params

    def _lag(self) -> float | None:
        """The largest lag of this server's replicas (None if none is known)."""
        lags = []
        for replica in self._replicas:
            try:
                lag = replica.replica_lag()
            except SchemalessError:
                lag = None
            if lag is not None:
                lags.append(lag)
        return max(lags) if lags else None

    def latency_ms(
        self, now: float, window: float, quantile: float, least: int = 1, stall: float = 0.0
    ) -> float | None:
        """The ``quantile`` of the probes that ended in the last ``window`` seconds and
        the probe in flight (at its age so far), but at most their second slowest: one
        slow probe is a hiccup, not a trend (a p90 of nine probes or fewer would be
        their slowest).  With fewer than ``least`` of them, None.  A probe in flight
        for ``stall`` seconds or more counts at its age in any case: a stalled server
        answers no other probe.  None if there is nothing to tell."""
        recent = [s for end, s in list(self._samples) if now - end <= window]
        started = self._started
        age = None if started is None else now - started
        if age is not None:
            recent.append(age)
        stalled = age if age is not None and age >= stall > 0 else None
        if len(recent) < least:
            return None if stalled is None else stalled * 1000
        ordered = sorted(recent)
        value = percentile(ordered, quantile)
        if len(ordered) > 1:
            value = min(value, ordered[-2])
        return max(value, stalled or 0.0) * 1000

    def reset(self) -> None:
        """Forget the probes so far (after the baseline)."""
        self._samples.clear()
