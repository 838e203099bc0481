"""The throttle's controller: which signals are over their limits, and AIMD on rows/s.

Pure code (no I/O, no clock): ``judge`` turns the signals of each server into
``Breach``es; ``Aimd.update`` turns the breaches and the rate the Cleaner achieved into
the rows/s it may use next.  Additive increase while every signal is under its limit,
multiplicative decrease when one is over, a pause on critical load; ``--rate`` caps it.

A signal over its limit lowers the rate only if its evidence is newer than the last
decrease (a canary window that began after it, a clients' report published after
it); evidence that predates it holds the rate where it is.  The clients publish every
few seconds and the canary is a window of seconds: without this one slow moment would
be counted again at every step until it left the window, cutting the rate several
times for one breach.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Aimd", "Breach", "Limits", "ServerSignals", "Tuning", "judge"]


@dataclass(frozen=True)
class Tuning:
    """The controller's constants (the defaults aim at writers' p99 <= 2x idle while
    the backfill keeps >= 50 % of its unthrottled speed)."""

    #: multiplicative decrease: a signal over its limit sets the limit to a fraction
    #: of the rate the Cleaner achieved: limit / signal (a signal 10 % over cuts about
    #: 10 %), between ``deepest`` and ``gentlest``; ``decrease`` when the signal has
    #: no magnitude
    decrease: float = 0.7
    deepest: float = 0.5
    gentlest: float = 0.9
    #: additive increase per second, while every signal is under its limit: this
    #: fraction of the fastest rate seen (0.05: from half speed to full in 10 s)
    increase: float = 0.1
    #: seconds after a decrease before the next one (the signals need that long to
    #: show its effect: a canary window, a client report)
    cooldown: float = 2.0
    #: the limit grows only while the Cleaner uses this share of it (no growth of a
    #: limit the copy does not reach: it would not hold back the next burst); one
    #: that is above the fastest rate seen and not used that much is lifted
    binding: float = 0.7
    #: the limit never goes below this fraction of the fastest rate seen, nor below
    #: ``min_rate`` rows/s (stopping altogether is ``--critical-load``'s business)
    floor: float = 0.02
    min_rate: float = 10.0
    #: slow start: the first limit (rows/s; None: no limit until a breach), which
    #: grows ``ramp`` times a second while every signal is clear and the copy uses it,
    #: until the first breach (a copy that starts at full speed hurts before any
    #: signal can show it); a cut below ``start`` starts it again
    start: float | None = 40000.0
    ramp: float = 2.0
    #: seconds the observed rate lags the limit (it is measured over a window: half
    #: of it); while the limit ramps, "the copy uses it" compares the observed rate
    #: with the limit of that long ago (a rate that follows a limit doubling a second
    #: averages about half of it over the last two seconds)
    lag: float = 1.0


@dataclass(frozen=True)
class Breach:
    """A signal at or over its limit, e.g. ``server 1 p90 4.1 ms > 3.0 ms``."""

    text: str
    critical: bool = False
    #: which signal: "canary", "clients", "load", "lag" (a critical one: "paused")
    kind: str = "load"
    #: when the evidence began (monotonic seconds; None: measured just now)
    since: float | None = None
    #: the signal over its limit (> 1; None: not a measure, e.g. a pause)
    over: float | None = None


@dataclass(frozen=True)
class Limits:
    """The thresholds, per server id where they depend on a baseline."""

    canary_ms: Mapping[int, float] = field(default_factory=dict)
    clients_ms: Mapping[int, float] = field(default_factory=dict)
    max_load: Mapping[str, int] = field(default_factory=dict)
    critical_load: Mapping[str, int] = field(default_factory=dict)
    max_lag: float | None = None
    quantile: float = 0.99  # of the canary signal, named in the reason (p90, p99)

    def __str__(self) -> str:
        """One readable line for the log: ``canary p99 at most 12.5 ms on server 0, ...``."""

        def per_server(ms: Mapping[int, float]) -> str:
            return ", ".join(f"{v:.1f} ms on server {sid}" for sid, v in sorted(ms.items()))

        def loads(load: Mapping[str, int]) -> str:
            return ", ".join(f"{name} {n}" for name, n in sorted(load.items()))

        parts = [
            f"canary p{self.quantile * 100:g} at most {per_server(self.canary_ms) or 'n/a'}",
            f"clients' p99 at most {per_server(self.clients_ms) or 'n/a (no reports)'}",
            f"load at most {loads(self.max_load) or 'n/a'}",
            f"critical load {loads(self.critical_load) or 'n/a'}",
            f"replica lag at most {self.max_lag:g} s" if self.max_lag is not None else "",
        ]
        return "; ".join(p for p in parts if p)


@dataclass(frozen=True)
class ServerSignals:
    """What was measured on one server (None: not known)."""

    sid: int
    canary_ms: float | None = None
    clients_ms: float | None = None
    status: Mapping[str, int] = field(default_factory=dict)  # lower-case names
    lag: float | None = None
    #: when the canary's window began, and the earliest the clients' report can have
    #: been published
    canary_since: float | None = None
    clients_since: float | None = None


def judge(signals: Iterable[ServerSignals], limits: Limits) -> list[Breach]:
    """The breaches of every server, critical ones first."""
    out: list[Breach] = []
    for s in signals:
        where = f"server {s.sid}"
        for name, limit in limits.critical_load.items():
            value = s.status.get(name.lower())
            if value is not None and value >= limit:
                text = f"{where} {name} {value} >= {limit}"
                out.append(Breach(text, critical=True, kind="paused"))
        canary = limits.canary_ms.get(s.sid)
        if s.canary_ms is not None and canary is not None and s.canary_ms > canary:
            p = f"p{limits.quantile * 100:g}"
            text = f"{where} {p} {s.canary_ms:.1f} ms > {canary:.1f} ms"
            over = s.canary_ms / canary
            out.append(Breach(text, kind="canary", since=s.canary_since, over=over))
        clients = limits.clients_ms.get(s.sid)
        if s.clients_ms is not None and clients is not None and s.clients_ms > clients:
            text = f"{where} clients' p99 {s.clients_ms:.1f} ms > {clients:.1f} ms"
            over = s.clients_ms / clients
            out.append(Breach(text, kind="clients", since=s.clients_since, over=over))
        for name, limit in limits.max_load.items():
            value = s.status.get(name.lower())
            if value is not None and value >= limit:
                out.append(Breach(f"{where} {name} {value} >= {limit}", over=value / limit))
        if s.lag is not None and limits.max_lag is not None and s.lag > limits.max_lag:
            text = f"{where} replica lag {s.lag:.1f} s > {limits.max_lag:g} s"
            out.append(Breach(text, kind="lag", over=s.lag / limits.max_lag))
    return sorted(out, key=lambda b: not b.critical)


class Aimd:
    """The rows/s limit (``rate``: None for none) and why (``reason``)."""

    def __init__(self, cap: float | None = None, tuning: Tuning | None = None) -> None:
        self.cap = cap
        self.tuning = tuning or Tuning()
        self.limit: float | None = self.tuning.start
        self._ramping = self.limit is not None
        self.paused = False
        self.reason = ""
        self.last_breach = ""
        self.peak = 0.0  # the fastest rate seen (rows/s)
        self._last: float | None = None
        self._decreased = -math.inf

    @property
    def rate(self) -> float | None:
        """The rows/s allowed now: the limit, capped by ``cap``; 0 while paused."""
        if self.paused:
            return 0.0
        limits = [x for x in (self.limit, self.cap) if x is not None]
        return min(limits) if limits else None

    def update(self, now: float, observed: float, breaches: list[Breach]) -> None:
        """One step: ``observed`` rows/s were achieved lately; ``breaches`` are over."""
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        if not self.paused:
            self.peak = max(self.peak, observed)
        if breaches and breaches[0].critical:
            self.last_breach = breaches[0].text
            if not self.paused:  # resume below the rate that led here
                self._decrease(now, observed, self.tuning.decrease)
            self.paused = True
            self.reason = "paused: " + breaches[0].text
            return
        self.paused = False
        if breaches:
            fresh = [b for b in breaches if b.since is None or b.since > self._decreased]
            self.last_breach = (fresh or breaches)[0].text
            if fresh and now - self._decreased >= self.tuning.cooldown:
                self._decrease(now, observed, self._cut(fresh))
            self.reason = "throttled: " + self.last_breach
            return  # evidence from before the last decrease: hold
        self._increase(dt, observed)

    def _cut(self, breaches: list[Breach]) -> float:
        """The cut for these breaches: limit / signal of the worst, within bounds
        (``decrease`` if one has no magnitude)."""
        t = self.tuning
        over = [b.over for b in breaches if b.over is not None]
        if len(over) < len(breaches):
            return t.decrease
        return min(t.gentlest, max(t.deepest, 1.0 / max(over)))

    def _decrease(self, now: float, observed: float, cut: float) -> None:
        t = self.tuning
        known = [x for x in (self.limit, self.cap, observed or None, self.peak or None) if x]
        if not known:
            return  # nothing flows yet: nothing to slow down
        self.limit = max(t.min_rate, t.floor * self.peak, cut * min(known))
        self._decreased = now
        # Below the slow start's first rate the copy can hardly be what is slow, and
        # its peak says nothing of what it could do: once clear, it climbs back as it
        # began (TCP's slow start after a timeout), not by a share of that peak.
        self._ramping = t.start is not None and self.limit < t.start

    def _increase(self, dt: float, observed: float) -> None:
        t = self.tuning
        used = self.limit  # the limit the observed rate reflects
        if used is not None and self._ramping:
            used /= t.ramp**t.lag
        if self.limit is not None and used is not None and observed >= t.binding * used:
            if self._ramping:
                self.limit *= t.ramp**dt
            else:
                self.limit += t.increase * max(self.peak, self.limit) * dt
        # a limit the copy does not use is lifted, but not a slow start's: before the
        # first batch nothing is used yet, and the copy would begin at full speed
        elif self.limit is not None and not self._ramping and self.limit >= self.peak:
            self.limit = None  # not holding anything back any more
        if self.limit is not None and not self.last_breach:
            self.reason = "starting slowly"
        elif self.limit is not None:
            self.reason = f"recovering (last: {self.last_breach})"
        else:
            self.reason = "capped by --rate" if self.cap is not None else ""
