"""Client metrics in the application's ``prometheus_client`` registry.

``instrument(ds, registry=registry)`` (the ``schemaless-mysql[metrics]`` extra) counts
every call of ``ds`` from then on: latency by verb, and of each round trip by verb and
server; errors by type; retries; ``OutcomeUnknown``.  The pools and the servers' health
are read when the registry is scraped.  Labels name verbs, servers and error types:
never a value.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .errors import OutcomeUnknown, SchemalessError
from .health import DOWN, SUSPECT
from .hooks import observe

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from .store import DataStore

__all__ = ["instrument"]

#: Seconds: a get takes well under a millisecond, a fan-out or a stalled server seconds.
BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

_HINT = "client metrics need prometheus_client: pip install 'schemaless-mysql[metrics]'"


def instrument(ds: DataStore, registry: CollectorRegistry | None = None) -> None:
    """Register the metrics of ``ds`` in ``registry`` (default: prometheus_client's
    global ``REGISTRY``); one datastore per registry."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError(_HINT) from exc
    registry = prometheus_client.REGISTRY if registry is None else registry
    observe(ds, _Metrics(registry))
    registry.register(_Pools(ds))


class _Metrics:
    """Histograms and counters, updated by ``schemaless.hooks``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        name = "schemaless_client_"
        self.calls = Histogram(
            name + "call_seconds",
            "Calls of the datastore, by verb",
            ["verb"],
            registry=registry,
            buckets=BUCKETS,
        )
        self.statements = Histogram(
            name + "statement_seconds",
            "Round trips (one statement batch each), by verb and server",
            ["verb", "server"],
            registry=registry,
            buckets=BUCKETS,
        )
        self.errors = Counter(
            name + "errors",
            "Calls that raised, by verb and error type",
            ["verb", "error"],
            registry=registry,
        )
        self.retries = Counter(
            name + "retries",
            "Batches sent again, by server and error type",
            ["server", "error"],
            registry=registry,
        )
        self.unknown = Counter(
            name + "outcome_unknown",
            "Writes whose commit may or may not have happened",
            ["verb"],
            registry=registry,
        )

    @contextlib.contextmanager
    def call(self, verb: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        except SchemalessError as exc:
            self.errors.labels(verb, type(exc).__name__).inc()
            if isinstance(exc, OutcomeUnknown):
                self.unknown.labels(verb).inc()
            raise
        finally:
            self.calls.labels(verb).observe(time.perf_counter() - started)

    def statement(self, verb: str, server: str, sql: str, seconds: float) -> None:
        self.statements.labels(verb, server).observe(seconds)

    def retried(self, server: str, error: SchemalessError) -> None:
        self.retries.labels(server, type(error).__name__).inc()


class _Pools:
    """Gauges read at scrape time: each pool's use, each server's health."""

    def __init__(self, ds: DataStore) -> None:
        self._cluster = ds.cluster

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        name = "schemaless_client_"
        families: dict[str, Any] = {
            "in_use": GaugeMetricFamily(
                name + "pool_in_use", "Connections taken from the pool", labels=["server"]
            ),
            "waiting": GaugeMetricFamily(
                name + "pool_waiting", "Threads waiting for a connection", labels=["server"]
            ),
            "down": GaugeMetricFamily(
                name + "server_down", "1 while the server is marked down", labels=["server"]
            ),
            "suspect": GaugeMetricFamily(
                name + "server_suspect", "1 while the server is suspect", labels=["server"]
            ),
            "downs": CounterMetricFamily(
                name + "server_downs", "Times the server was marked down", labels=["server"]
            ),
        }
        for server in self._cluster.servers():
            in_use, waiting = server.pool_state()
            state = server.health.state
            for key, value in (
                ("in_use", in_use),
                ("waiting", waiting),
                ("down", state.state == DOWN),
                ("suspect", state.state == SUSPECT),
                ("downs", state.downs),
            ):
                families[key].add_metric([server.name], float(value))
        return families.values()
