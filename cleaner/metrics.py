"""The Cleaner's figures, and an optional Prometheus endpoint that serves them
(prometheus_client, the ``schemaless-mysql[metrics]`` extra)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["HELD", "Figures", "MetricsServer", "figure_families", "held_text"]

#: Seconds the throttle held a copy back, one figure per kind of signal
#: (``throttled_<aimd.Breach.kind>_s``), and the kind as the summary names it.
HELD = {
    "throttled_canary_s": "canary",
    "throttled_clients_s": "clients' p99",
    "throttled_load_s": "load",
    "throttled_lag_s": "replica lag",
    "throttled_paused_s": "paused",
}

#: Figures that only grow (Prometheus counters); the others are gauges.
_COUNTERS = frozenset(
    {
        "rows_checked",
        "orphans_deleted",
        "rows_backfilled",
        "rows_deferred",
        "rows_upserted",
        "rechecked",
        "unindexable",
        "corrupt",
        "fenced",
        "deferred",
        "purged",
        "purge_skipped",
        "passes",
        "backoffs",
        "server_downs",  # times a server was marked down (see schemaless.health)
        "duplicates",
        "expired_purged",
        "expired_kept",
        "expire_skipped",
        *HELD,
    }
)


@dataclass
class Figures:
    """What the Cleaner did so far; updated from several threads."""

    state: str = "starting"
    last_pass: int = 0  # µs, end of the last complete pass
    rows_checked: int = 0
    orphans_deleted: int = 0
    rows_backfilled: int = 0
    rows_deferred: int = 0  # index rows a backfill deferred: their target's server was down
    deferrals: int = 0  # (source, target) shard pairs whose deferred rows are not written yet
    rows_upserted: int = 0
    rechecked: int = 0  # backfill batches changed by writers meanwhile: versions read again
    unindexable: int = 0
    corrupt: int = 0
    fenced: int = 0
    deferred: int = 0
    purged: int = 0
    purge_skipped: int = 0  # passes whose purge the user's grants did not allow
    feed_trimmed: int = 0  # change feed rows acknowledged by every subscription or too old
    backlog: int = 0
    rows_per_s: float = 0.0  # the backfill's rate so far
    passes: int = 0
    backoffs: int = 0
    throttle_limit: float | None = None  # rows/s the throttle allows (None: no limit)
    throttle: str = ""  # why it limits: "throttled: server 1 p90 4.1 ms > 3.0 ms"
    #: seconds of the copy during which a signal of each kind was over its limit (the
    #: first one named in the reason), critical load: paused
    throttled_canary_s: float = 0.0
    throttled_clients_s: float = 0.0
    throttled_load_s: float = 0.0
    throttled_lag_s: float = 0.0
    throttled_paused_s: float = 0.0
    duplicates: int = 0  # values of a unique index that two live entities produce
    expired_purged: int = 0  # expired entities deleted (guarded by the version seen)
    expired_kept: int = 0  # expired when read, re-put before the delete: kept
    expired_pending: int = 0  # expired, found by this pass and not yet deleted
    expire_skipped: int = 0  # passes whose expiry the user's grants did not allow
    pending_shards: int = 0  # logical shards this pass left for later: a server unavailable
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: float) -> None:
        """Add to some counters."""
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def set(self, **values: Any) -> None:
        """Set some figures (state, backlog, last_pass)."""
        with self._lock:
            for name, value in values.items():
                setattr(self, name, value)

    def as_dict(self) -> dict[str, Any]:
        """A snapshot, for the catalog heartbeat and the summary."""
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}


def figure_families(
    figures: Mapping[str, Any],
    labels: Mapping[str, str],
    *,
    prefix: str = "schemaless_cleaner",
    counters: frozenset[str] = _COUNTERS,
    helps: Mapping[str, str] | None = None,
) -> list[Metric]:
    """Figures as Prometheus metric families: ``<prefix>_<figure>`` (``counters`` with
    ``_total``; ``helps``: their help texts, else the name), and ``<prefix>_up``
    labelled with the state."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    names, values = sorted(labels), [labels[k] for k in sorted(labels)]
    out: list[Metric] = []
    for name, value in sorted(figures.items()):
        if name == "state":
            up = GaugeMetricFamily(f"{prefix}_up", "The process's state", labels=[*names, "state"])
            up.add_metric([*values, str(value)], 1)
            out.append(up)
        elif isinstance(value, (int, float)):  # the throttle's reason, no limit: not figures
            kind = CounterMetricFamily if name in counters else GaugeMetricFamily
            text = (helps or {}).get(name, name.replace("_", " "))
            family = kind(f"{prefix}_{name}", text, labels=names)
            family.add_metric(values, float(value))
            out.append(family)
    return out


class MetricsServer:
    """``GET /metrics`` on ``host:port`` (127.0.0.1 by default), served by
    prometheus_client from a daemon thread; ``collect`` gives the families."""

    def __init__(
        self, collect: Callable[[], Iterable[Metric]], port: int, host: str = "127.0.0.1"
    ) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as exc:
            raise ImportError(
                "the metrics endpoint needs prometheus_client: "
                "pip install 'schemaless-mysql[metrics]'"
            ) from exc
        registry = CollectorRegistry()
        registry.register(_Collector(collect))
        self._httpd, self._thread = start_http_server(port, host, registry)
        self.port = int(self._httpd.server_address[1])

    def close(self) -> None:
        """Stop serving."""
        self._httpd.shutdown()
        self._httpd.server_close()


class _Collector:
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self.collect = collect


def held_text(figures: Mapping[str, Any]) -> str:
    """``throttled 31.2s (canary 25.0s, clients' p99 6.2s)``: how long each kind of
    signal held the copy back (figures ``HELD``); "" if none did."""
    held = {name: float(figures.get(figure) or 0.0) for figure, name in HELD.items()}
    parts = [f"{name} {seconds:.1f}s" for name, seconds in held.items() if seconds >= 0.05]
    return f"throttled {sum(held.values()):.1f}s ({', '.join(parts)})" if parts else ""
