"""Write latency as the library's clients feel it, for the Cleaner's throttle.

Each ``Server`` keeps a ``LatencySample``: the round trips of its most recent write
batches (those that commit), appended without a lock (a bounded ``deque``'s append is
atomic).  A ``DataStore`` publishes the p99 of each server's recent samples in its row
of the catalog's ``clients`` table, at most every ``PUBLISH_INTERVAL`` seconds, right
after a catalog refresh (on the thread that refreshed; one statement).  The Cleaner's
throttle reads the rows (``Catalog.client_reports``); its own store does not publish.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import PermissionDenied, SchemalessError, TableMissing

if TYPE_CHECKING:
    from .catalog import Catalog
    from .connection import Server

__all__ = ["PUBLISH_INTERVAL", "LatencyReporter", "LatencySample", "p99", "percentile", "summarise"]

log = logging.getLogger(__name__)

#: Samples kept per server: the most recent write round trips.
SAMPLES = 512
#: Seconds between two publications of one client.
PUBLISH_INTERVAL = 5.0
#: Fewer samples than this in a window: no p99 published for that server.
MIN_SAMPLES = 10


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1, nearest rank) of some values (0.0 if none)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def p99(values: Iterable[float]) -> float:
    """The 99th percentile (nearest rank) of some values (0.0 if none)."""
    return percentile(values, 0.99)


class LatencySample:
    """The latest ``SAMPLES`` write round trips of one server, in seconds."""

    __slots__ = ("_recent",)

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=SAMPLES)

    def record(self, seconds: float) -> None:
        """Add one round trip (no lock: called on every write)."""
        self._recent.append(seconds)

    def take(self) -> list[float]:
        """The samples since the last ``take`` (a sample appended to the old deque
        while it is swapped is lost: harmless)."""
        recent, self._recent = self._recent, deque(maxlen=SAMPLES)
        return list(recent)


class LatencyReporter:
    """Publishes a client's recent p99 per server (``maybe_publish``); switched off
    for good when the catalog refuses it (a catalog or grants from before it)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.enabled = True
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._last = time.monotonic()

    def maybe_publish(self, servers: Iterable[Server]) -> None:
        """Publish if enabled and ``PUBLISH_INTERVAL`` has passed (never raises)."""
        now = time.monotonic()
        if not self.enabled or now - self._last < PUBLISH_INTERVAL:
            return
        self._last = now
        report = summarise({s.name: s.latency.take() for s in servers})
        if not report:
            return
        try:
            self.catalog.report_client(self.name, report)
        except (PermissionDenied, TableMissing) as exc:
            self.enabled = False
            log.info("client latency not published (catalog or grants predate it): %s", exc)
        except SchemalessError as exc:
            log.debug("client latency not published: %s", exc)


def summarise(samples: Mapping[str, list[float]]) -> dict[str, dict[str, Any]]:
    """``server -> {"p99_ms": ..., "n": ...}`` for the servers with enough samples."""
    return {
        name: {"p99_ms": round(p99(values) * 1000, 3), "n": len(values)}
        for name, values in samples.items()
        if len(values) >= MIN_SAMPLES
    }
