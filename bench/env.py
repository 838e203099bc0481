"""The servers a benchmark runs on, and the raw mysqlclient baseline's connections.

The raw client connects exactly as the library does (same credentials, charset,
session settings, multi-statements, autocommit), keeps a small pool per server, and
sends each batch with the driver's lowest-level calls (``literal`` + ``query`` +
``store_result``), so the baseline is as cheap as raw SQL from Python gets.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import MySQLdb
from MySQLdb.constants import CLIENT

from schemaless.connection import SESSION_SQL
from schemaless.local import LocalCluster

from .provenance import commit

__all__ = ["RawClient", "Recorder", "Servers", "machine_info", "start_cluster"]

T = TypeVar("T")


@dataclass(frozen=True)
class Servers:
    """Where to connect: ``host:port`` addresses and the option file with credentials."""

    addresses: tuple[str, ...]
    option_file: str

    def connect(self, i: int, **extra: Any) -> Any:
        """A driver connection to server ``i`` with the library's session settings."""
        host, _, port = self.addresses[i].rpartition(":")
        return MySQLdb.connect(
            host=host,
            port=int(port),
            read_default_file=self.option_file,
            read_default_group="client",
            charset="utf8mb4",
            autocommit=True,
            client_flag=CLIENT.MULTI_STATEMENTS | CLIENT.MULTI_RESULTS,
            init_command=SESSION_SQL,
            **extra,
        )

    def admin(self, i: int, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on server ``i`` on a fresh connection; its rows."""
        db = self.connect(i)
        try:
            cur = db.cursor()
            cur.execute(sql, tuple(params) or None)
            rows = list(cur.fetchall() or ())
            while cur.nextset():  # a multi-statement batch runs to its end
                pass
            return rows
        finally:
            db.close()


def start_cluster(base_dir: str | Path, servers: int = 2, durable: bool = True) -> Servers:
    """Start (or find running) the local cluster in ``base_dir``."""
    cluster = LocalCluster(base_dir, servers=servers, durable=durable).up()
    return Servers(tuple(cluster.addresses), str(cluster.option_file))


class Recorder:
    """Collects round trips (server, start, end, thread) while enabled; thread-safe."""

    def __init__(self) -> None:
        self.enabled = False
        self.calls: list[tuple[str, float, float, int]] = []
        self._lock = threading.Lock()

    def tracer(self, server: str, sql: str, seconds: float) -> None:
        """A ``DataStore(tracer=...)`` hook."""
        if self.enabled:
            self.record(server, time.perf_counter() - seconds)

    def record(self, server: str, started: float) -> None:
        end = time.perf_counter()
        with self._lock:
            self.calls.append((server, started, end, threading.get_ident()))

    def take(self) -> list[tuple[str, float, float, int]]:
        with self._lock:
            calls, self.calls = self.calls, []
        return calls


def summarise_round_trips(
    calls: list[tuple[str, float, float, int]], caller: int | None = None
) -> tuple[int, int, dict[str, int]]:
    """(round trips, sequential steps, round trips per server) of one operation.

    Round trips in flight at the same time (a parallel fan-out, the library's and the
    raw client's alike) form one step: steps are the groups of overlapping intervals
    (of the ``caller`` thread's round trips, when given: the caller waits for those
    only, not for a library's background ones).
    """
    per_server: dict[str, int] = {}
    for server, *_ in calls:
        per_server[server] = per_server.get(server, 0) + 1
    steps, end = 0, float("-inf")
    waited = [c for c in calls if caller is None or c[3] == caller]
    for _, started, ended, _ in sorted(waited, key=lambda c: c[1]):
        if started > end:
            steps += 1
        end = max(end, ended)
    return len(calls), steps, per_server


class RawClient:
    """Raw mysqlclient: a pool of connections per server and a pipelined fan-out."""

    def __init__(self, servers: Servers, recorder: Recorder | None = None) -> None:
        self.servers = servers
        self.recorder = recorder
        self._idle: list[deque[Any]] = [deque() for _ in servers.addresses]

    def close(self) -> None:
        for idle in self._idle:
            while idle:
                idle.pop().close()

    def run(self, sid: int, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Send one batch to server ``sid``; the rows of every result set."""
        return self._receive(sid, *self._send(sid, sql, params))

    def run_counts(
        self, sid: int, sql: str, params: Sequence[Any] = ()
    ) -> tuple[list[tuple[Any, ...]], list[int]]:
        """``run``, and the affected-row counts of the statements without a result set
        (as the library reads them: which writes of a batch applied)."""
        counts: list[int] = []
        return self._receive(sid, *self._send(sid, sql, params), counts), counts

    def fanout(self, batches: Mapping[int, tuple[str, Sequence[Any]]]) -> dict[int, Any]:
        """One batch per server, servers in parallel: every batch is sent before any
        reply is read (the same pipelining as the library's ``gather``)."""
        sent = {sid: self._send(sid, sql, params) for sid, (sql, params) in batches.items()}
        return {sid: self._receive(sid, *state) for sid, state in sent.items()}

    def _send(self, sid: int, sql: str, params: Sequence[Any]) -> tuple[Any, float]:
        idle = self._idle[sid]
        try:
            db = idle.pop()
        except IndexError:
            db = self.servers.connect(sid)
        started = time.perf_counter()
        db.send_query(sql.encode() % tuple(db.literal(p) for p in params) if params else sql)
        return db, started

    def _receive(
        self, sid: int, db: Any, started: float, counts: list[int] | None = None
    ) -> list[tuple[Any, ...]]:
        db.read_query_result()
        results: list[tuple[Any, ...]] = []
        while True:
            result = db.store_result()
            if result is not None:
                results.append(result.fetch_row(maxrows=0))
            elif counts is not None:
                counts.append(db.affected_rows())
            if db.next_result() != 0:
                break
        # A result object takes the connection's lock when it is freed: free it before
        # the connection goes back to the pool, or another thread may find it locked.
        del result
        rec = self.recorder
        if rec is not None and rec.enabled:
            rec.record(self.servers.addresses[sid], started)
        self._idle[sid].append(db)
        return results


def machine_info(servers: Servers) -> dict[str, Any]:
    """What the figures were measured on."""
    rows = servers.admin(
        0,
        "SELECT @@version, @@innodb_flush_log_at_trx_commit, @@innodb_buffer_pool_size,"
        " @@innodb_log_file_size",
    )
    version, flush, pool, redo = rows[0]
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        ram = 0.0
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "library": library_version(),
        "nproc": os.cpu_count() or 0,
        "ram_gib": round(ram, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "mariadb": str(version),
        "servers": len(servers.addresses),
        "innodb_flush_log_at_trx_commit": int(flush),
        "durable": int(flush) == 1,
        "innodb_buffer_pool_mib": int(pool) // 2**20,
        "innodb_log_file_mib": int(redo) // 2**20,
    }


def library_version() -> str:
    """The commit the library was measured at (``+dirty`` if schemaless/ had changes)."""
    return commit("schemaless", "cleaner")


def set_server_globals(
    servers: Servers, durable: bool | None, buffer_pool_mib: int, redo_log_mib: int = 0
) -> None:
    """Make every server durable (or not), size its buffer pool and its redo log (0:
    leave it; resized online, MariaDB 10.9 and later), for this run."""
    for i in range(len(servers.addresses)):
        if durable is not None:
            servers.admin(i, f"SET GLOBAL innodb_flush_log_at_trx_commit = {1 if durable else 2}")
        if buffer_pool_mib:
            servers.admin(i, f"SET GLOBAL innodb_buffer_pool_size = {int(buffer_pool_mib) << 20}")
        if redo_log_mib:
            servers.admin(i, f"SET GLOBAL innodb_log_file_size = {int(redo_log_mib) << 20}")
