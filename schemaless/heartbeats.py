"""Who is alive: the daemons' heartbeats with their figures, and the clients' recent
write latency per server (which the Cleaner's throttle reads).

Each is one row per name, replaced on every report; rows silent for longer than their
retention are deleted by the next report.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from .catalogdb import CatalogDB, now_us

__all__ = ["CLIENT_RETENTION_US", "HEARTBEAT_RETENTION_US", "ClientReport", "Heartbeats"]

#: A daemon whose last heartbeat is older than this is forgotten (7 days).
HEARTBEAT_RETENTION_US = 7 * 24 * 3600 * 10**6
#: A client whose last latency report is older than this is forgotten (one minute).
CLIENT_RETENTION_US = 60 * 10**6


class ClientReport(NamedTuple):
    """One client's latest write-latency report (``Catalog.client_reports``)."""

    heartbeat: int  # µs, the client's clock
    latencies: dict[str, Any]  # server -> {"p99_ms": ..., "n": ...}


class Heartbeats(CatalogDB):
    """The catalog's ``status`` (daemons) and ``clients`` tables."""

    def heartbeat(self, name: str, figures: dict[str, Any]) -> None:
        """Record that a daemon is alive, with its figures; forget the daemons silent
        for ``HEARTBEAT_RETENTION_US`` (each ``cleaner --once`` from cron is a new name)."""
        now = now_us()
        self.server.run(
            f"REPLACE INTO {self._t('status')} (name, heartbeat, figures) VALUES (%s, %s, %s);"
            f" DELETE FROM {self._t('status')} WHERE heartbeat < %s",
            (name, now, json.dumps(figures, sort_keys=True), now - HEARTBEAT_RETENTION_US),
        )

    def statuses(self) -> dict[str, tuple[int, dict[str, Any]]]:
        """``name -> (heartbeat_us, figures)`` of every daemon that reported."""
        out = self.server.run(f"SELECT name, heartbeat, figures FROM {self._t('status')}")
        return {str(n): (int(h), json.loads(f)) for n, h, f in out[0]}

    def report_client(self, name: str, latencies: dict[str, Any]) -> None:
        """Record a client's recent write latency per server; forget the clients
        silent for ``CLIENT_RETENTION_US``."""
        now = now_us()
        self.server.run(
            f"REPLACE INTO {self._t('clients')} (name, heartbeat, latencies) VALUES (%s, %s, %s);"
            f" DELETE FROM {self._t('clients')} WHERE heartbeat < %s",
            (name, now, json.dumps(latencies, sort_keys=True), now - CLIENT_RETENTION_US),
        )

    def client_reports(self, since_us: int) -> dict[str, ClientReport]:
        """``client -> (heartbeat, {server: {"p99_ms": ..., "n": ...}})`` reported since
        ``since_us`` (the heartbeat on the client's clock: it tells reports apart)."""
        out = self.server.run(
            f"SELECT name, heartbeat, latencies FROM {self._t('clients')} WHERE heartbeat >= %s",
            (since_us,),
        )
        return {str(n): ClientReport(int(h), json.loads(f)) for n, h, f in out[0]}
