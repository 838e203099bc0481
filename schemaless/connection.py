"""Connections to one MySQL server: a bounded pool, one round trip per call.

``Server.run`` sends one (multi-statement) batch and returns every result set.  A
``Server`` owns a small pool (connections are never shared between threads), each
server's ``Health`` (a server that let a call wait out a timeout fails the next calls at
once until a probe finds it answering) and each call's deadline
(``schemaless.deadline``).  Driver errors become schemaless errors in
``schemaless.translate``; batches in flight, retries and ``gather`` are
``schemaless.batch`` (re-exported here).
"""

from __future__ import annotations

import contextlib
import random
import select
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import MySQLdb
from MySQLdb.constants import CLIENT

from . import deadline, forking
from .batch import Batch, Reply, Retryable, Rows, Sent, gather, gather_partial
from .deadline import Watchdog
from .dsn import Address, Credentials
from .errors import (
    DataStoreClosed,
    OutcomeUnknown,
    SchemalessError,
    ShardTimeout,
    ShardUnavailable,
    TransientError,
)
from .health import DOWN, Health
from .latency import LatencySample
from .owned import VERDICT, unguarded, verdict
from .translate import DEADLOCK, LOST, NOT_SENT, TIMED_OUT_HINTS, error_code, translate
from .wire import close_quietly, literals, read_results

__all__ = [
    "Batch",
    "ConnectOptions",
    "Reply",
    "Retry",
    "Rows",
    "Server",
    "Tracer",
    "gather",
    "gather_partial",
]

#: Called after every round trip with the server's name, the SQL template and seconds.
Tracer = Callable[[str, str, float], None]

SESSION_SQL = (
    "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,"
    "ERROR_FOR_DIVISION_BY_ZERO,NO_ZERO_DATE,NO_ZERO_IN_DATE', "
    "SESSION tx_isolation = 'READ-COMMITTED'"
)

_SSL_KEYS = frozenset({"ca", "capath", "cert", "key", "cipher", "mode"})
_SSL_MODES = ("VERIFY_IDENTITY", "VERIFY_CA")  # libmariadb checks the host name in both
# A connection that read a reply this recently is reused without polling its socket
# (the poll releases the GIL, which many threads then fight to take back): a server
# that closed it since is down right now, as no restart takes 10 ms, and a new
# connection would fail as well.
_JUST_USED = 0.01
# A stale connection's ping waits at most this long (and never more than read_timeout):
# a server that does not answer it is suspect, and no other idle connection is pinged.
_PING = 1.0
# Work that starts after the call's deadline passed (the other replies of a fan-out
# while one server kept the caller waiting, a partial query's next step) gets this long
# on pooled connections: a call ends by its deadline plus this, and a server is marked
# down only for a reply it owed before the deadline.
_GRACE = 0.2

_WATCHDOG = Watchdog()


@dataclass(frozen=True)
class Retry:
    """Exponential backoff with full jitter for errors that are safe to retry."""

    attempts: int = 4
    base: float = 0.005
    cap: float = 0.25

    def delays(self) -> Iterator[float]:
        """Sleep before each retry (``attempts - 1`` of them)."""
        for n in range(self.attempts - 1):
            yield random.uniform(0, min(self.cap, self.base * 2**n))


@dataclass(frozen=True)
class ConnectOptions:
    """How to connect to every server of a datastore."""

    credentials: Credentials = field(default_factory=Credentials)
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    write_timeout: float = 30.0
    pool_size: int = 16
    pool_wait: float = 10.0
    stale_after: float = 30.0
    ssl: dict[str, str] | None = None
    retry: Retry = field(default_factory=Retry)

    def __post_init__(self) -> None:
        if self.ssl is not None:
            unknown = sorted(set(self.ssl) - _SSL_KEYS)
            if unknown:
                raise ValueError(
                    f"unknown ssl option {unknown[0]!r}: use {', '.join(sorted(_SSL_KEYS))}"
                )
            if self.ssl.get("mode", _SSL_MODES[0]) not in _SSL_MODES:
                raise ValueError(
                    f"ssl mode {self.ssl['mode']!r} is not supported: use {' or '.join(_SSL_MODES)}"
                    " (unverified TLS falls back to plaintext without a word)"
                )


class _Conn:
    """One driver connection, when it was last used, and a poller of its socket."""

    __slots__ = ("__weakref__", "db", "last_used", "poller")

    def __init__(self, db: Any) -> None:
        self.db = db
        self.last_used = time.monotonic()
        self.poller = select.poll()
        self.poller.register(db.fileno(), select.POLLIN)

    def closed_by_peer(self) -> bool:
        """Whether the idle connection's socket is readable (or hung up): the server
        closed it, so a batch sent on it would be lost, a commit reported as
        OutcomeUnknown."""
        try:
            return bool(self.poller.poll(0))
        except (OSError, ValueError):
            return True


class Server:
    """A pool of connections to one server, and the only place SQL is sent."""

    def __init__(
        self,
        address: Address,
        options: ConnectOptions,
        tracer: Tracer | None = None,
        on_packet: Callable[[int], None] | None = None,
    ) -> None:
        self.address = address
        self.name = str(address)
        self.options = options
        self.tracer = tracer
        #: told the server's name and the error before each retry (``schemaless.hooks``)
        self.on_retry: Callable[[str, SchemalessError], None] | None = None
        # the owned layout's data database, quoted: batches naming it carry the check
        self.guarded_db: str | None = None
        #: the server's max_allowed_packet, read on its first connection (None before)
        self.max_packet: int | None = None
        self._on_packet = on_packet  # told the packet once it is known
        self.latency = LatencySample()  # write round trips, for the Cleaner's throttle
        self._idle: deque[_Conn] = deque()
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)
        self._in_use = 0
        self._waiting = 0  # threads waiting in _acquire for a connection
        self._closed = False
        self._open: weakref.WeakSet[_Conn] = weakref.WeakSet()  # idle or in use
        self.health = Health(self.name)
        #: what the driver waits for a reply at most (it takes whole seconds)
        self._read_timeout = max(1, round(options.read_timeout))
        forking.register(self)

    def __repr__(self) -> str:
        return f"Server({self.name!r})"

    # -- the pool ---------------------------------------------------------------------

    def _connect(self, at: float | None) -> _Conn:
        """A new connection, given at most ``connect_timeout`` and what is left until
        ``at`` (the driver takes whole seconds: at least 1)."""
        opts = self.options
        limit = opts.connect_timeout
        left = deadline.left(at)
        if left is not None:
            if left <= 0:
                raise self._expired("before connecting")
            limit = min(limit, max(1, int(left)))
        kwargs: dict[str, Any] = dict(
            host=self.address.host,
            port=self.address.port,
            connect_timeout=max(1, round(limit)),
            read_timeout=self._read_timeout,
            write_timeout=max(1, round(opts.write_timeout)),
            charset="utf8mb4",
            autocommit=True,
            client_flag=CLIENT.MULTI_STATEMENTS | CLIENT.MULTI_RESULTS,
            init_command=SESSION_SQL,
            **opts.credentials.connect_kwargs(),
        )
        if opts.ssl is not None:
            # Always a verifying mode: with libmariadb, any other mode silently connects
            # in plaintext when the server (or a man in the middle) offers no TLS.
            ssl = dict(opts.ssl)
            kwargs["ssl_mode"] = ssl.pop("mode", _SSL_MODES[0])
            kwargs["ssl"] = ssl
        try:
            conn = _Conn(MySQLdb.connect(**kwargs))
        except MySQLdb.Error as exc:
            error = translate(self.name, exc, sent=False, commits=False)
            self._note(exc, error, silent=isinstance(error, ShardTimeout))
            raise error from exc
        if self.max_packet is None:
            self._learn_packet(conn)
        self._open.add(conn)
        return conn

    def _learn_packet(self, conn: _Conn) -> None:
        """Read ``max_packet`` on a first connection (one round trip per server and
        process); a failure discards the connection like a failed connect."""
        try:
            conn.db.query("SELECT @@max_allowed_packet")
            packet = int(read_results(conn.db, None)[0][0][0])
        except MySQLdb.Error as exc:
            close_quietly(conn.db)
            error = translate(self.name, exc, sent=False, commits=False)
            self._note(exc, error, silent=isinstance(error, ShardTimeout))
            raise error from exc
        self.max_packet = packet
        if self._on_packet is not None:
            self._on_packet(packet)

    def after_fork(self) -> None:
        """In a forked child: the connections are the parent's sessions.  Detach their
        sockets here and start with an empty pool (and fresh locks)."""
        for conn in list(self._open):
            with contextlib.suppress(Exception):  # closed already: nothing to detach
                forking.detach(conn.db.fileno())
        self._open = weakref.WeakSet()
        self._idle = deque()
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)
        self._in_use = self._waiting = 0
        self.health.reset()  # the probe thread, if any, was the parent's

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A healthy connection for this thread; discarded if the block raises.  A
        driver error that leaves the block is translated, as for ``run``."""
        conn = self._acquire(deadline.current())
        try:
            yield conn.db
        except MySQLdb.Error as exc:
            self.release(conn, healthy=False)
            raise translate(self.name, exc, sent=True, commits=False) from exc
        except BaseException:
            self.release(conn, healthy=False)
            raise
        self.release(conn, healthy=True)

    def _acquire(self, at: float | None) -> _Conn:
        """Take a pooled connection (or a new one), waiting at most ``pool_wait`` and
        never past ``at``; at once ``ShardUnavailable`` if the server is marked down."""
        self.health.check()
        with self._lock:
            if self._in_use >= self.options.pool_size:
                until = time.monotonic() + self.options.pool_wait
                by_deadline = at is not None and at < until
                if at is not None and by_deadline:
                    until = at  # the call ends first
                self._waiting += 1
                try:
                    while self._in_use >= self.options.pool_size:
                        left = until - time.monotonic()
                        if left <= 0 or not self._returned.wait(left):
                            busy = f"{self.name}: all {self.options.pool_size} connections busy"
                            raise (
                                self._expired(f"waiting for a connection ({busy})")
                                if by_deadline
                                else ShardUnavailable(f"{busy} for {self.options.pool_wait:g}s")
                            )
                finally:
                    self._waiting -= 1
            if self._closed:
                raise DataStoreClosed(f"{self.name}: the datastore is closed")
            self._in_use += 1
            conn = self._idle.pop() if self._idle else None
        try:
            return self._checkout(conn, at)
        except BaseException:
            with self._lock:
                self._in_use -= 1
                if self._waiting:
                    self._returned.notify()
            raise

    def release(self, conn: _Conn, *, healthy: bool) -> None:
        """Return a connection; one that saw an error is closed, never reused."""
        keep = healthy and not self._closed
        if keep:
            conn.last_used = time.monotonic()
        else:
            close_quietly(conn.db)
        with self._lock:
            self._in_use -= 1
            if keep:
                self._idle.append(conn)
            if self._waiting:
                self._returned.notify()

    def _checkout(self, conn: _Conn | None, at: float | None) -> _Conn:
        """A usable connection: ``conn`` (taken from the idle ones) if it still is,
        else the next idle one, else a new one.  A stale one is pinged, briefly; if
        the server does not answer, it is suspect and its idle connections dropped."""
        while conn is not None:
            idle = time.monotonic() - conn.last_used
            if idle < _JUST_USED:
                return conn
            if not conn.closed_by_peer():  # e.g. the server restarted: never send on it
                if idle < self.options.stale_after:
                    return conn
                left = deadline.left(at)
                if left is not None and left <= 0:  # no time to check it: keep it idle
                    with self._lock:
                        self._idle.append(conn)
                    raise self._expired("before a stale connection could be pinged")
                bound = min(_PING, self.options.read_timeout, _PING if left is None else left)
                if self._ping(conn, bound):
                    return conn
                close_quietly(conn.db)
                self._suspect(f"a stale connection's ping got no reply within {bound:.2g}s")
                break
            close_quietly(conn.db)
            with self._lock:
                conn = self._idle.pop() if self._idle else None
        return self._connect(at)

    @staticmethod
    def _ping(conn: _Conn, bound: float) -> bool:
        """Whether the server answers a trivial statement on ``conn`` within ``bound``
        seconds (never a silent reconnect: a dead connection is replaced)."""
        try:
            conn.db.send_query(b"DO 1")
            if not conn.poller.poll(bound * 1000):
                return False  # the reply may still come: the connection is closed
            conn.db.read_query_result()
            read_results(conn.db, None)
            return True
        except MySQLdb.Error:
            return False

    # -- health -----------------------------------------------------------------------

    def _note(self, exc: MySQLdb.Error, error: SchemalessError, *, silent: bool) -> None:
        """Mark the server after a driver error: down if it kept the caller waiting
        (``silent``), suspect if it dropped or refused a connection."""
        if silent:
            self._mark_down(str(error))
        elif error_code(exc) in LOST:
            self._suspect(str(error))

    def _suspect(self, reason: str) -> None:
        """Drop the idle connections (likely dead too) of a server that may be down."""
        self.health.suspect(reason)
        self._drop_idle()

    def _mark_down(self, reason: str) -> None:
        """Calls fail at once from now on, until the probe started here gets an answer."""
        if self.health.down(reason):
            self._drop_idle()
            threading.Thread(
                target=self._probe, name=f"schemaless-probe-{self.name}", daemon=True
            ).start()

    def _probe(self) -> None:
        """Open a connection after a growing backoff until one opens; it joins the pool.
        Only a server that keeps silent stays down: one that refuses connections is
        suspect (calls find that out again at no cost)."""
        while not self._closed and self.health.state.state == DOWN:
            time.sleep(self.health.next_probe())
            try:
                conn = self._connect(None)
            except ShardTimeout:
                continue
            except SchemalessError as exc:
                self.health.up()
                self.health.suspect(str(exc))
                return
            self.health.up()
            self._release_new(conn)
            return

    def _release_new(self, conn: _Conn) -> None:
        """Put a connection opened outside a call (the probe's) into the pool."""
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        close_quietly(conn.db)

    def _drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle), deque()
        for conn in idle:
            close_quietly(conn.db)

    def _expired(self, when: str) -> ShardTimeout:
        return ShardTimeout(f"{self.name}: the call's deadline passed {when}")

    def pool_state(self) -> tuple[int, int]:
        """Connections in use, and threads waiting for one."""
        return self._in_use, self._waiting

    def close(self) -> None:
        """Close idle connections; connections in use close when returned."""
        with self._lock:
            self._closed = True
        self._drop_idle()

    # -- one round trip ---------------------------------------------------------------

    def run(
        self,
        sql: str,
        params: Sequence[Any] = (),
        *,
        commits: bool = False,
        idempotent: bool = True,
        counts: list[int] | None = None,
    ) -> Rows:
        """Send one batch; return the rows of each result set, in order.

        ``counts``: filled with the affected rows of each statement without a result
        set (INSERT, UPDATE, DELETE; also START TRANSACTION and COMMIT, as 0).

        ``commits``: the batch contains a COMMIT, so a connection lost after sending it
        raises ``OutcomeUnknown``.  ``idempotent``: the batch may be sent again after a
        lost connection.  Deadlocks and lock timeouts are always retried (the server
        rolled the transaction back).
        """
        return Batch(self, sql, params, commits, idempotent, counts).send().result()

    def send(self, batch: Batch) -> Sent | Exception:
        """Take a connection and send the batch without waiting for the reply; the
        error instead if that failed (the connection is then discarded).  Interrupts
        (KeyboardInterrupt, SystemExit) are raised at once, never deferred."""
        started = time.perf_counter()
        guarded = self.guarded_db
        if guarded is not None and guarded in batch.sql:
            unguarded(batch.sql)
        at = deadline.current()
        try:
            conn = self._acquire(at)
        except Exception as exc:  # marked down, pool exhausted or closed, connect failed
            return exc
        if at is not None and at + _GRACE <= time.monotonic():
            self.release(conn, healthy=True)
            return self._expired("before sending")
        try:
            db = conn.db
            params = batch.params
            db.send_query(batch.sql.encode() % literals(db, params) if params else batch.sql)
            return Sent(conn, started, at)
        except BaseException as exc:
            self.release(conn, healthy=False)
            if isinstance(exc, MySQLdb.Error):
                self._traced(batch, started)
                return self._failed(exc, commits=batch.commits, waited=0.0)
            if isinstance(exc, Exception):
                return exc
            raise

    def receive(self, batch: Batch, sent: Sent) -> Rows:
        """Read the reply of a sent batch and give its connection back; by the call's
        deadline (plus ``_GRACE`` when it had passed already) the watchdog cuts it."""
        healthy = False
        db = sent.conn.db
        armed = None
        waiting = time.monotonic()
        owed = sent.at is not None and waiting < sent.at  # a reply owed before the deadline
        # The driver's read timeout ends a silent wait by itself; the watchdog is
        # needed only when the deadline comes first (most calls need none of it).
        if sent.at is not None and sent.at + _GRACE < waiting + self._read_timeout:
            armed = _WATCHDOG.arm(db.fileno(), sent.at if owed else sent.at + _GRACE)
        try:
            if batch.counts is not None:
                batch.counts.clear()
            db.read_query_result()
            results = read_results(db, batch.counts)
            healthy = True
        except MySQLdb.Error as exc:
            cut = armed is not None and _WATCHDOG.disarm(armed)
            if cut:
                raise self._cut(batch, owed) from exc
            raise self._failed(
                exc, commits=batch.commits, waited=time.monotonic() - waiting
            ) from exc
        finally:
            if armed is not None and _WATCHDOG.disarm(armed):
                healthy = False  # cut just after the reply came: the socket is shut down
            self.release(sent.conn, healthy=healthy)
            self._traced(batch, sent.started)
        self.health.up()
        if batch.sql.endswith(VERDICT):  # a guarded read's last result set: checked, taken off
            return verdict(results, self.name)
        return results

    def _cut(self, batch: Batch, owed: bool) -> Exception:
        """The error of a reply the watchdog cut at the call's deadline (never retried);
        a server that kept the caller waiting until then (``owed``) is marked down."""
        error: TransientError = (
            OutcomeUnknown(f"commit outcome unknown, no reply by the call's deadline: {self.name}")
            if batch.commits
            else ShardTimeout(f"server did not answer by the call's deadline: {self.name}")
        )
        if owed:
            self._mark_down(str(error))
        return error

    def _traced(self, batch: Batch, started: float) -> None:
        seconds = time.perf_counter() - started
        if batch.commits:
            self.latency.record(seconds)
        if self.tracer is not None:
            self.tracer(self.name, batch.sql, seconds)

    def _failed(self, exc: MySQLdb.Error, *, commits: bool, waited: float) -> Exception:
        """A driver error after sending: the error to raise, or ``_Retryable``.  A
        connection lost after ``waited`` seconds of read_timeout was a timeout."""
        error = translate(self.name, exc, sent=True, commits=commits)
        error.__cause__ = exc
        code = error_code(exc)
        text = str(exc).lower()
        client = 2000 <= code < 3000  # the driver's own errors: the server said nothing
        self._note(
            exc,
            error,
            silent=(client and any(h in text for h in TIMED_OUT_HINTS))
            or (code == 2013 and waited >= max(1, round(self.options.read_timeout)) - 0.1),
        )
        if code in DEADLOCK or (isinstance(error, ShardUnavailable) and code in NOT_SENT):
            return Retryable(error, after_send=False)
        if type(error) is ShardUnavailable and code in (2006, 2013) and not commits:
            return Retryable(error, after_send=True)
        return error

    def replica_lag(self) -> float | None:
        """Seconds this server (a replica) is behind its primary; None if it is not
        replicating (stopped, broken, or not a replica)."""
        with self.connection() as db:
            db.query("SHOW REPLICA STATUS")
            result = db.store_result()
            names = [d[0] for d in result.describe()] if result is not None else []
            rows = result.fetch_row(maxrows=0) if result is not None else ()
            del result
        if not rows or "Seconds_Behind_Master" not in names:
            return None
        lag = rows[0][names.index("Seconds_Behind_Master")]
        return float(lag) if lag is not None else None
