"""The adaptive throttle: how fast may the Cleaner go now, and if slower, why.

One ``Throttler`` per Cleaner process.  ``start`` takes a baseline of each server's
canary latency (before any batch), then a process of its own probes every server
(``Canary``, ``ProbeProcess``) and a thread, every ``interval`` seconds, reads the
clients' latency reports and runs the controller (``aimd``).  The jobs only ask:
``reserve(rows)`` is the wait before a batch may go (None while paused);
``describe()`` is the limit and its reason, also kept in the Cleaner's figures
(``throttle_limit``, ``throttle``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from schemaless.catalog import now_us
from schemaless.errors import SchemalessError
from schemaless.latency import PUBLISH_INTERVAL, percentile
from schemaless.schema import canary_db
from schemaless.store import DataStore

from .aimd import Aimd, Limits, ServerSignals, Tuning, judge
from .canary import LEAST, Canary
from .metrics import Figures
from .prober import ProbeProcess
from .throttle import TokenBucket

__all__ = ["ThrottleSettings", "Throttler", "parse_load"]

log = logging.getLogger("schemaless.cleaner")

_STATUS_VAR = re.compile(r"[A-Za-z_]{1,64}\Z")


def _shown(signals: list[ServerSignals]) -> str:
    """``server 0 canary 1.2 ms clients 3.4 ms``, for each server (a debug line)."""

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f} ms"

    shown = (f"server {s.sid} canary {ms(s.canary_ms)} clients {ms(s.clients_ms)}" for s in signals)
    return ", ".join(shown)


def parse_load(text: str) -> dict[str, int]:
    """``Threads_running=25[,NAME=N...]`` -> ``{"Threads_running": 25, ...}``."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not (sep and _STATUS_VAR.match(name) and value.isdigit() and int(value) > 0):
            raise ValueError(f"expected STATUS_VARIABLE=N (N > 0), got {part!r}")
        out[name] = int(value)
    return out


@dataclass(frozen=True)
class ThrottleSettings:
    """What the throttle watches, and its limits (None: derived at start)."""

    #: canary and clients' p99 limit; default ``latency_factor`` x the baseline
    max_latency_ms: float | None = None
    max_load: Mapping[str, int] = field(default_factory=lambda: {"Threads_running": 25})
    critical_load: Mapping[str, int] = field(default_factory=lambda: {"Threads_running": 50})
    #: replica lag limit in seconds; default: the store's ``max_replica_lag``
    max_lag: float | None = None
    #: the derived latency limit: this times the baseline ...
    latency_factor: float = 2.0
    #: ... but at least this many ms (an idle canary is too fast to compare with)
    latency_floor_ms: float = 6.0
    #: seconds between two probes of a server, and between two controller steps
    interval: float = 0.25
    #: the canary signal is this quantile of the probes of the last ``window``
    #: seconds (a p99 of 16 probes is their maximum: one hiccup of a busy machine),
    #: and the baseline the same quantile of its probes
    quantile: float = 0.9
    window: float = 4.0
    #: probes per server for the baseline, back to back, for at most this long
    baseline_probes: int = 20
    baseline_seconds: float = 3.0
    #: seconds over which the achieved rate is measured
    observe: float = 2.0
    tuning: Tuning = field(default_factory=Tuning)


class Throttler:
    """Adaptive pacing for one Cleaner process (see the module docstring)."""

    def __init__(
        self,
        store: DataStore,
        settings: ThrottleSettings,
        *,
        figures: Figures | None = None,
        cap: float | None = None,
        batch: int = 2000,
    ) -> None:
        self.store = store
        self.settings = settings
        self.figures = figures or Figures()
        self.aimd = Aimd(cap, settings.tuning)
        self.canaries: dict[int, Canary] = {}
        self.limits = Limits()
        self._bucket = TokenBucket(1.0, burst=batch)
        self._lock = threading.Lock()
        self._rows = 0
        self._first: float | None = None  # when the first rows were reserved
        self._done: deque[tuple[float, int]] = deque()  # (time, rows so far)
        self._clients: dict[int, tuple[float, float]] = {}  # sid -> (p99 ms, published)
        self._seen: dict[tuple[str, int], float] = {}  # (client, heartbeat) -> published
        self._clients_read = 0.0
        self._stepped: float | None = None  # the last controller step
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None  # the controller's
        self.probes: ProbeProcess | None = None

    # -- asked by the jobs -----------------------------------------------------------

    def reserve(self, rows: int) -> float | None:
        """Take ``rows``: seconds to wait before using them, None while paused (ask
        again later)."""
        rate = self.aimd.rate
        if rate == 0.0:
            return None
        with self._lock:
            self._rows += rows
            if self._first is None:
                self._first = time.monotonic()
        if rate is None:
            return 0.0
        if rate != self._bucket.rate:
            self._bucket.set_rate(rate)
        return self._bucket.reserve(rows)

    def describe(self) -> str:
        """``limit 5,000 rows/s, throttled: server 1 p90 4.1 ms > 3.0 ms``, or ``""``."""
        rate, reason = self.aimd.rate, self.aimd.reason
        if rate is None or not reason:
            return reason
        return reason if rate == 0.0 else f"limit {rate:,.0f} rows/s, {reason}"

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, name: str) -> None:
        """Baseline, then the probe process and the controller thread (``name``: the
        canary row)."""
        if self._thread is not None:
            return
        cluster = self.store.cluster
        topo = cluster.current()
        watched = sorted({*self.settings.max_load, *self.settings.critical_load})
        for sid, server in cluster.all_servers(topo).items():
            replicas = [cluster.server(a) for a in topo.replicas.get(sid, ())]
            self.canaries[sid] = Canary(server, canary_db(topo.prefix), name, watched, replicas)
        self._run_each(self._baseline)  # here: no batch has run yet
        self.limits = self._limits()
        log.info("throttle limits: %s", self.limits)
        self.probes = ProbeProcess(self.canaries, self.settings.interval)
        self.probes.start()
        self._thread = threading.Thread(target=self._loop, name="cleaner-throttle", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the controller thread and the probe process."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.probes is not None:
            self.probes.close()
            self.probes = None

    def _run_each(self, fn: Callable[[Canary], None]) -> None:
        """``fn(canary)`` for every canary, in parallel (a slow server delays no other)."""
        threads = [threading.Thread(target=fn, args=(c,)) for c in self.canaries.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _baseline(self, canary: Canary) -> None:
        """Measure a canary's idle latency (no batch has run yet)."""
        deadline = time.monotonic() + self.settings.baseline_seconds
        samples = [canary.probe()]
        while len(samples) < self.settings.baseline_probes and time.monotonic() < deadline:
            samples.append(canary.probe())
        canary.baseline_ms = percentile(samples, self.settings.quantile) * 1000
        canary.reset()

    def _limits(self) -> Limits:
        s = self.settings
        # what clients felt before the first batch
        client_base = {sid: p99 for sid, (p99, _) in self._read_clients(0.0).items()}

        def derived(base: float) -> float:
            return max(s.latency_floor_ms, s.latency_factor * base)

        if s.max_latency_ms is not None:
            canary = {sid: s.max_latency_ms for sid in self.canaries}
            clients = dict(canary)
        else:
            canary = {sid: derived(c.baseline_ms) for sid, c in self.canaries.items()}
            clients = {sid: derived(base) for sid, base in client_base.items()}
        max_lag = s.max_lag if s.max_lag is not None else self.store.cluster.max_replica_lag
        return Limits(canary, clients, s.max_load, s.critical_load, max_lag, s.quantile)

    # -- the controller ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.interval):
            try:
                self.step(time.monotonic())
            except Exception:  # never let the thread die: the limit stays as it was
                log.exception("throttle: controller step failed")

    def step(self, now: float) -> None:
        """One controller step: signals, breaches, the new limit."""
        if now - self._clients_read >= PUBLISH_INTERVAL / 2:
            self._clients_read = now
            self._clients = self._read_clients(now)
        window = self.settings.window
        signals = []
        for sid, canary in self.canaries.items():
            clients, published = self._clients.get(sid, (None, None))
            # a probe in flight for twice the limit: the server stalls
            stall = 2 * self.limits.canary_ms.get(sid, 0.0) / 1000
            signals.append(
                ServerSignals(
                    sid,
                    canary.latency_ms(now, window, self.settings.quantile, LEAST, stall),
                    clients,
                    dict(canary.status),
                    canary.lag,
                    canary_since=now - window,
                    clients_since=published,
                )
            )
        breaches = judge(signals, self.limits)
        observed = self._observed(now)
        self.aimd.update(now, observed, breaches)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("throttle: %.0f rows/s, %s; %s", observed, self.describe(), _shown(signals))
        self.figures.set(throttle_limit=self.aimd.rate, throttle=self.aimd.reason)
        if breaches and self._first is not None and self._stepped is not None:
            self.figures.add(**{f"throttled_{breaches[0].kind}_s": now - self._stepped})
        self._stepped = now

    def _observed(self, now: float) -> float:
        """Rows/s reserved over the last ``observe`` seconds (since the first rows,
        over at least two intervals: the first batches do not make a burst)."""
        with self._lock:
            rows, first = self._rows, self._first
        if first is None:
            return 0.0
        if not self._done:
            self._done.append((first, 0))
        self._done.append((now, rows))
        while len(self._done) > 1 and now - self._done[1][0] >= self.settings.observe:
            self._done.popleft()
        start, before = self._done[0]
        return (rows - before) / max(now - start, 2 * self.settings.interval)

    def _read_clients(self, now: float) -> dict[int, tuple[float, float]]:
        """The clients' recent p99 per server id (the largest one reported), with the
        earliest time that report can have been published: when this throttle first
        read it, less the interval between reads (``now`` less it for a new one)."""
        topo = self.store.cluster.topology
        ids = {str(address): sid for sid, address in topo.servers.items()}
        since = now_us() - int(2 * PUBLISH_INTERVAL * 1e6)
        try:
            reports = self.store.cluster.catalog.client_reports(since)
        except SchemalessError as exc:  # an old catalog, a server away: no client signal
            log.debug("throttle: client latency not read: %s", exc)
            return {}
        seen = {
            (name, r.heartbeat): self._seen.get((name, r.heartbeat), now - PUBLISH_INTERVAL / 2)
            for name, r in reports.items()
        }
        self._seen = seen  # only the reports still read: bounded by the clients
        out: dict[int, tuple[float, float]] = {}
        for name, report in reports.items():
            for server, figures in report.latencies.items():
                sid = ids.get(server)
                if sid is not None and isinstance(figures, dict):
                    p99 = float(figures.get("p99_ms", 0.0))
                    if p99 >= out.get(sid, (0.0, 0.0))[0]:
                        out[sid] = (p99, seen[(name, report.heartbeat)])
        return out
