"""The catalog: cluster map, index definitions and states, checkpoints, dictionaries.

One database (``<prefix>_catalog``) on the first server.  Clients load it in one
round trip (``Catalog.load``) and refresh it on an interval; everything that must
survive a restart of any process (index states, Cleaner checkpoints and heartbeats,
codec dictionaries) lives here.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any, NamedTuple

from .connection import Server
from .dsn import Address
from .errors import CatalogError, IndexDefinitionError
from .expiry import META_NAME as EXPIRE_ON
from .index import Index
from .names import quote
from .results import one, scalar
from .schema import CATALOG_TABLES, check_prefix, fence_table, shard_db

__all__ = [
    "Catalog",
    "ClientReport",
    "IndexInfo",
    "IndexState",
    "Topology",
    "backfill_job",
    "now_us",
    "sweep_job",
    "unfit_job",
    "unique_job",
]


class IndexState(StrEnum):
    """The index lifecycle: writers maintain ``building`` and ``ready`` indexes, queries
    use ``ready`` ones; the value is what the catalog stores."""

    BUILDING = "building"
    READY = "ready"
    DROPPED = "dropped"


#: A daemon whose last heartbeat is older than this is forgotten (7 days).
HEARTBEAT_RETENTION_US = 7 * 24 * 3600 * 10**6
#: A client whose last latency report is older than this is forgotten (one minute).
CLIENT_RETENTION_US = 60 * 10**6
FORMAT = "1"
#: The JSON of the duplicates kept per logical shard (the ``cursor`` column is a BLOB).
MAX_SHOWN_BYTES = 60_000


def backfill_job(index: str) -> str:
    """The checkpoint job of an index's backfill."""
    return f"backfill:{index}"


def sweep_job(index: str) -> str:
    """The checkpoint job of an index's sweep (a cursor per shard)."""
    return f"sweep:{index}"


def unfit_job(index: str) -> str:
    """The checkpoint rows of the entities a backfill set aside because their values
    do not fit the index, per scanned logical shard (as ``unique_job``)."""
    return f"unfit:{index}"


#: Examples kept of the writes that blocked a build.
_BLOCK_EXAMPLES = 5


def unique_job(index: str) -> str:
    """The checkpoint rows of a unique index's duplicates, per scanned logical shard
    (``rows_done``: how many were found; ``cursor``: a JSON list of some of them)."""
    return f"unique:{index}"


#: The catalog server's clock in microseconds: index state changes are stamped with
#: it, and the Cleaner's grace period is measured on it, so client clocks may differ.
_SERVER_US = "(UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6)))"  # one instant, no time zone


def _known(state: str) -> IndexState:
    """``state`` as an :class:`IndexState`; a ``CatalogError`` if it is none."""
    try:
        return IndexState(state)
    except ValueError:
        raise CatalogError(f"unknown index state {state!r}") from None


def now_us() -> int:
    """Wall-clock microseconds since the epoch."""
    return time.time_ns() // 1000


@dataclass(frozen=True)
class IndexInfo:
    """An index definition with its lifecycle state."""

    index: Index
    state: IndexState
    created: int
    changed: int


@dataclass(frozen=True)
class Topology:
    """A snapshot of the catalog: where every logical shard lives, and the indexes."""

    prefix: str
    n_shards: int
    map_version: int
    refresh_interval: float
    servers: dict[int, Address]
    shard_servers: tuple[int, ...]
    indexes: dict[str, IndexInfo]
    dictionary_ids: tuple[int, ...]
    active_dictionary: int | None
    moves: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # shard -> move
    replicas: dict[int, tuple[Address, ...]] = field(default_factory=dict)  # server -> replicas
    index_epoch: int = 0  # bumped by every index declaration; 0: a catalog from before fences
    expire_on: str | None = None  # the property holding expiry times (schemaless.expiry)
    changes: bool = False  # the change feed is on (schemaless.feed)

    @property
    def fence(self) -> str | None:
        """The fence table every write of a body names (None before fences existed)."""
        return fence_table(self.index_epoch) if self.index_epoch else None

    @property
    def routing(self) -> tuple[int, int, tuple[str, ...]]:
        """What decides which tables a client names (the map, the fence, the indexes
        writers maintain): when it changed, a client that got "table doesn't exist"
        retries on the new map."""
        return self.map_version, self.index_epoch, tuple(sorted(i.name for i in self.maintained()))

    @cached_property
    def dbs(self) -> tuple[str, ...]:
        """The database name of every logical shard, by shard number."""
        return tuple(shard_db(self.prefix, s) for s in range(self.n_shards))

    def shards_of(self, server_id: int) -> list[int]:
        """The logical shards that live on one server."""
        return [s for s, sid in enumerate(self.shard_servers) if sid == server_id]

    def maintained(self) -> list[Index]:
        """Indexes that writers keep up to date (building or ready)."""
        return [i.index for i in self.indexes.values() if i.state != IndexState.DROPPED]

    def ready(self) -> list[Index]:
        """Indexes that are ``ready`` (backfilled; their tables have ``KEY by_entity``)."""
        return [i.index for i in self.indexes.values() if i.state == IndexState.READY]


class ClientReport(NamedTuple):
    """One client's latest write-latency report (``Catalog.client_reports``)."""

    heartbeat: int  # µs, the client's clock
    latencies: dict[str, Any]  # server -> {"p99_ms": ..., "n": ...}


class Catalog:
    """Reads and changes the catalog database through its server."""

    def __init__(self, server: Server, prefix: str) -> None:
        self.server = server
        self.prefix = check_prefix(prefix)
        self.db = f"{prefix}_catalog"

    def _t(self, table: str) -> str:
        return quote(self.db, table)

    @property
    def _lock_map(self) -> str:
        """Lock the map version's row until the transaction ends: the declaration of an
        index and the flip of a shard move take it, so they never interleave."""
        return f"SELECT value FROM {self._t('meta')} WHERE name = 'map_version' FOR UPDATE"

    def server_now_us(self) -> int:
        """The catalog server's clock, in microseconds since the epoch."""
        return int(scalar(self.server.run(f"SELECT {_SERVER_US}")[0]))

    # -- creation -----------------------------------------------------------------------

    def exists(self) -> bool:
        """Whether this server holds an initialised catalog for the prefix."""
        rows = self.server.run(
            "SELECT COUNT(*) FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name = 'meta'",
            (self.db,),
        )
        if not scalar(rows[0]):
            return False
        return bool(self.server.run(f"SELECT 1 FROM {self._t('meta')} WHERE name = 'shards'")[0])

    def ensure_tables(self) -> None:
        """Create the catalog database and any table it lacks (an upgrade is this)."""
        ddl = [f"CREATE DATABASE IF NOT EXISTS {quote(self.db)}"]
        ddl += [
            f"CREATE TABLE IF NOT EXISTS {self._t(name)} ({cols}) ENGINE=InnoDB"
            for name, cols in CATALOG_TABLES.items()
        ]
        self.server.run(";\n".join(ddl))

    def create(self, addresses: Sequence[Address], n_shards: int, refresh_interval: float) -> bool:
        """Create the catalog and the shard map if absent; True if this call created it.

        Safe to run concurrently: the first writer of the map wins, the others find it.
        """
        if not 1 <= n_shards <= 65536:
            raise CatalogError(f"number of logical shards must be 1..65536, got {n_shards}")
        if not addresses:
            raise CatalogError("a datastore needs at least one server")
        self.ensure_tables()
        stmts = ["START TRANSACTION"]
        params: list[Any] = []
        stmts.append(
            f"INSERT IGNORE INTO {self._t('meta')} (name, value) VALUES"
            " ('format', %s), ('shards', %s), ('map_version', '1'), ('refresh_interval', %s),"
            " ('index_epoch', '1')"
        )
        params += [FORMAT, str(n_shards), repr(float(refresh_interval))]
        # Only the writer whose meta rows went in writes the map: a racing creator with
        # another shard count or server list must not add its rows to the winner's.
        stmts.append("SET @created := ROW_COUNT() = 5")
        stmts.append("SELECT @created")
        for table, cols, rows in (
            (
                "servers",
                "server_id, host, port",
                [(i, a.host, a.port) for i, a in enumerate(addresses)],
            ),
            ("shards", "shard, server_id", [(s, s % len(addresses)) for s in range(n_shards)]),
        ):
            marks = ", ".join(["(" + ", ".join(["%s"] * len(rows[0])) + ")"] * len(rows))
            stmts.append(
                f"INSERT IGNORE INTO {self._t(table)} ({cols}) WITH v ({cols}) AS"
                f" (VALUES {marks}) SELECT {cols} FROM v WHERE @created"
            )
            params += [value for row in rows for value in row]
        stmts.append("COMMIT")
        out = self.server.run(";\n".join(stmts), params, commits=True)
        return bool(scalar(out[0]) == 1)

    def start_epochs(self) -> None:
        """Give a catalog from before fences its first index epoch (its shards' fence
        tables must exist first); one that has an epoch keeps it."""
        self.server.run(
            f"INSERT IGNORE INTO {self._t('meta')} (name, value) VALUES ('index_epoch', '1')"
        )

    # -- reading ------------------------------------------------------------------------

    def load(self) -> Topology:
        """Read the whole catalog in one round trip, as one consistent snapshot (the
        session's READ COMMITTED would let each statement see a different moment, e.g.
        the map version before a shard move's flip and the move list after it)."""
        out = self.server.run(
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;"
            " START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY;"
            f" SELECT name, value FROM {self._t('meta')};"
            f" SELECT server_id, host, port FROM {self._t('servers')} ORDER BY server_id;"
            f" SELECT shard, server_id FROM {self._t('shards')} ORDER BY shard;"
            f" SELECT definition, state, created, changed FROM {self._t('indexes')};"
            f" SELECT dict_id FROM {self._t('dictionaries')} ORDER BY dict_id;"
            f" SELECT shard, source, target, phase FROM {self._t('moves')};"
            f" SELECT server_id, host, port FROM {self._t('replicas')} ORDER BY host, port;"
            " COMMIT"
        )
        meta = {str(k): str(v) for k, v in out[0]}
        if "shards" not in meta:
            raise CatalogError(f"no datastore {self.prefix!r} on {self.server.name}: run init")
        if meta.get("format") != FORMAT:
            raise CatalogError(f"catalog format {meta.get('format')!r} is not supported")
        n_shards = int(meta["shards"])
        shard_servers = tuple(int(sid) for _, sid in out[2])
        if len(shard_servers) != n_shards:
            raise CatalogError(f"catalog maps {len(shard_servers)} of {n_shards} shards")
        indexes = {}
        for definition, state, created, changed in out[3]:
            index = Index.from_dict(json.loads(definition))
            indexes[index.name] = IndexInfo(index, IndexState(state), int(created), int(changed))
        active = meta.get("active_dictionary")
        return Topology(
            prefix=self.prefix,
            n_shards=n_shards,
            map_version=int(meta["map_version"]),
            refresh_interval=float(meta.get("refresh_interval", "5.0")),
            servers={int(sid): Address(str(h), int(p)) for sid, h, p in out[1]},
            shard_servers=shard_servers,
            indexes=indexes,
            dictionary_ids=tuple(int(r[0]) for r in out[4]),
            active_dictionary=int(active) if active else None,
            moves={int(r[0]): (int(r[1]), int(r[2]), str(r[3])) for r in out[5]},
            replicas=_group_replicas(out[6]),
            index_epoch=int(meta.get("index_epoch", "0")),
            expire_on=meta.get(EXPIRE_ON) or None,
            changes=meta.get("changes") == "1",
        )

    def set_expire_on(self, prop: str | None, *, replace: bool) -> None:
        """Record the expiry property (None: entities never expire); without
        ``replace``, only if the datastore has none yet."""
        if prop is None:
            sql = f"DELETE FROM {self._t('meta')} WHERE name = %s"
            self.server.run(sql, (EXPIRE_ON,))
            return
        verb = "REPLACE" if replace else "INSERT IGNORE"
        self.server.run(
            f"{verb} INTO {self._t('meta')} (name, value) VALUES (%s, %s)", (EXPIRE_ON, prop)
        )

    # -- indexes ------------------------------------------------------------------------

    def record_index(self, index: Index, state: IndexState, epoch: int) -> IndexInfo | None:
        """Record a new index in ``state`` and move the index epoch on from ``epoch``
        (whose successor's fence tables the caller created); an identical existing
        index is returned as is.  None if the epoch is no longer ``epoch`` (another
        index was declared meanwhile): create the next fences and try again.

        A different definition under the same name is an ``IndexDefinitionError``.
        """
        state = _known(state)
        definition = json.dumps(index.to_dict(), sort_keys=True)
        meta = self._t("meta")
        out = self.server.run(
            f"START TRANSACTION; {self._lock_map}; SET @epoch = NULL;"  # pooled sessions
            f" SELECT value INTO @epoch FROM {meta} WHERE name = 'index_epoch';"
            f" INSERT IGNORE INTO {self._t('indexes')} (name, definition, state, created, changed)"
            f" SELECT %s, %s, %s, {_SERVER_US}, {_SERVER_US} FROM DUAL WHERE @epoch = %s;"
            " SET @added = ROW_COUNT();"
            f" UPDATE {meta} SET value = value + 1 WHERE name = 'index_epoch' AND @added > 0;"
            f" SELECT definition, state, created, changed FROM {self._t('indexes')}"
            " WHERE name = %s; COMMIT",
            (index.name, definition, state.value, str(epoch), index.name),
            commits=True,
        )
        row = one(out[1])
        if row is None:
            return None
        stored, stored_state, created, changed = row
        existing = Index.from_dict(json.loads(stored))
        if existing != index:
            raise IndexDefinitionError(
                f"index {index.name!r} already exists with a different definition: "
                f"{existing!r}; drop and purge it first"
            )
        return IndexInfo(existing, IndexState(stored_state), int(created), int(changed))

    def set_index_state(
        self, name: str, state: IndexState, *, expect: IndexState | None = None
    ) -> bool:
        """Move an index to ``state`` (only from ``expect`` if given); True if changed."""
        state = _known(state)
        sql = f"UPDATE {self._t('indexes')} SET state = %s, changed = {_SERVER_US} WHERE name = %s"
        params: list[Any] = [state.value, name]
        if expect is not None:
            sql += " AND state = %s"
            params.append(_known(expect).value)
        out = self.server.run(sql + "; SELECT ROW_COUNT()", params)
        return bool(scalar(out[0]))

    def set_ready(self, name: str) -> bool:
        """Mark a building index ready unless a write or a backfill recorded values it
        cannot hold (``block_index``, ``save_unfit``) or a backfill deferred rows
        (``schemaless.deferrals``); True if it is ready now.  The
        index row is locked first (``block_index`` holds a shared lock on it), so a
        block either commits before this reads the blocks or finds the index ready."""
        out = self.server.run(
            "START TRANSACTION; SET @marks = NULL, @writes = NULL, @deferred = NULL;"
            f" SELECT state FROM {self._t('indexes')} WHERE name = %s FOR UPDATE;"
            f" SELECT COUNT(*) INTO @marks FROM {self._t('checkpoints')}"
            " WHERE job = %s AND rows_done > 0 LOCK IN SHARE MODE;"
            f" SELECT COUNT(*) INTO @writes FROM {self._t('blocks')}"
            " WHERE index_name = %s AND writes > 0 LOCK IN SHARE MODE;"
            f" SELECT COUNT(*) INTO @deferred FROM {self._t('deferrals')}"
            " WHERE index_name = %s LOCK IN SHARE MODE;"
            f" UPDATE {self._t('indexes')} SET state = %s, changed = {_SERVER_US}"
            " WHERE name = %s AND state = %s AND @marks + @writes + @deferred = 0;"
            " SELECT ROW_COUNT(); COMMIT",
            (
                name,
                unfit_job(name),
                name,
                name,
                IndexState.READY.value,
                name,
                IndexState.BUILDING.value,
            ),
            commits=True,
        )
        return bool(scalar(out[1]))

    def block_index(self, name: str, example: dict[str, Any]) -> bool:
        """Record that a write met building index ``name`` with values it cannot hold
        (``example``: JSON, one of the first few kept), so that it cannot become ready;
        False (nothing recorded) if the index is not building.  The index row's shared
        lock is all it needs on ``indexes`` (the application user's grants)."""
        line = json.dumps(example, sort_keys=True) + "\n"
        out = self.server.run(
            "START TRANSACTION; SET @state = NULL;"
            f" SELECT state INTO @state FROM {self._t('indexes')} WHERE name = %s"
            " LOCK IN SHARE MODE;"
            f" INSERT INTO {self._t('blocks')} (index_name, writes, examples, updated)"
            " SELECT %s, 1, %s, %s FROM DUAL WHERE @state = %s"
            " ON DUPLICATE KEY UPDATE"
            f" examples = IF(writes < {_BLOCK_EXAMPLES}, CONCAT(examples, VALUES(examples)),"
            " examples), writes = writes + 1, updated = VALUES(updated);"
            " SELECT @state; COMMIT",
            (name, name, line.encode(), now_us(), IndexState.BUILDING.value),
            commits=True,
            idempotent=False,
        )
        return bool(scalar(out[0]) == IndexState.BUILDING.value)

    def blocks(self, name: str) -> tuple[tuple[int, list[Any]], dict[int, tuple[int, list[Any]]]]:
        """What keeps a building index from becoming ready besides duplicates: the
        writes that met it (how many, the first few) and the entities each logical
        shard's backfill set aside (``shard -> (how many, some)``)."""
        out = self.server.run(
            f"SELECT writes, examples FROM {self._t('blocks')} WHERE index_name = %s;"
            f" SELECT shard, rows_done, `cursor` FROM {self._t('checkpoints')}"
            " WHERE job = %s AND rows_done > 0",
            (name, unfit_job(name)),
        )
        writes: tuple[int, list[Any]] = (0, [])
        for count, examples in out[0]:
            lines = bytes(examples).decode().splitlines()
            writes = (int(count), [json.loads(line) for line in lines if line])
        unfit = {
            int(shard): (int(count), json.loads(bytes(cursor or b"[]")))
            for shard, count, cursor in out[1]
        }
        return writes, unfit

    def reopen_index(self, name: str, epoch: int) -> bool:
        """Forget what blocked a building index, every checkpoint and deferral of its
        backfill (the next one scans every shard again), and move the index epoch on from
        ``epoch`` (whose successor's fences the caller created: a write in flight that
        met the index before this commits before the old fences go, or fails and
        writes again, blocking it anew); False if the epoch is no longer ``epoch``."""
        meta = self._t("meta")
        jobs = (unfit_job(name), unique_job(name), backfill_job(name))
        out = self.server.run(
            f"START TRANSACTION; {self._lock_map};"
            f" UPDATE {meta} SET value = value + 1 WHERE name = 'index_epoch' AND value = %s;"
            " SET @moved = ROW_COUNT();"
            f" DELETE FROM {self._t('blocks')} WHERE index_name = %s AND @moved > 0;"
            f" DELETE FROM {self._t('checkpoints')} WHERE job IN (%s, %s, %s)"
            " AND @moved > 0;"
            f" DELETE FROM {self._t('deferrals')} WHERE index_name = %s AND @moved > 0;"
            " SELECT @moved; COMMIT",
            (str(epoch), name, *jobs, name),
            commits=True,
        )
        return bool(out[1][0][0])

    def enable_changes(self, epoch: int) -> bool:
        """Turn the change feed on and move the index epoch on from ``epoch`` (whose
        successor's fences the caller created), so that writers with an older map fail
        and refresh; False if the epoch is no longer ``epoch``."""
        meta = self._t("meta")
        out = self.server.run(
            f"START TRANSACTION; {self._lock_map};"
            f" UPDATE {meta} SET value = value + 1 WHERE name = 'index_epoch' AND value = %s;"
            " SET @moved = ROW_COUNT();"
            f" INSERT INTO {meta} (name, value) SELECT 'changes', '1' FROM DUAL WHERE @moved > 0"
            " ON DUPLICATE KEY UPDATE value = '1'; SELECT @moved; COMMIT",
            (str(epoch),),
            commits=True,
        )
        return bool(out[1][0][0])

    def forget_index(self, name: str) -> None:
        """Remove a dropped index from the catalog (after its tables are gone)."""
        self.server.run(
            f"DELETE FROM {self._t('indexes')} WHERE name = %s AND state = %s;"
            f" DELETE FROM {self._t('checkpoints')} WHERE job IN (%s, %s, %s, %s);"
            f" DELETE FROM {self._t('blocks')} WHERE index_name = %s;"
            f" DELETE FROM {self._t('deferrals')} WHERE index_name = %s",
            (
                name,
                IndexState.DROPPED.value,
                backfill_job(name),
                sweep_job(name),
                unique_job(name),
                unfit_job(name),
                name,
                name,
            ),
        )

    # -- checkpoints, heartbeats and dictionaries -----------------------------------------

    def checkpoints(self, job: str) -> dict[int, tuple[int, bool, int]]:
        """``shard -> (position, done, rows_done)`` for a job."""
        out = self.server.run(
            f"SELECT shard, position, done, rows_done FROM {self._t('checkpoints')} WHERE job = %s",
            (job,),
        )
        return {int(s): (int(p), bool(d), int(n)) for s, p, d, n in out[0]}

    def save_checkpoint(self, job: str, shard: int, position: int, done: bool, rows: int) -> None:
        """Advance a checkpoint; it never moves backward."""
        self.server.run(*self.checkpoint_sql(job, shard, position, done, rows))

    def checkpoint_sql(
        self, job: str, shard: int, position: int, done: bool, rows: int
    ) -> tuple[str, tuple[Any, ...]]:
        """The statement of ``save_checkpoint`` (to run in a transaction of its own)."""
        return (
            f"INSERT INTO {self._t('checkpoints')}"
            " (job, shard, position, done, rows_done, updated) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON DUPLICATE KEY UPDATE"
            " rows_done = IF(VALUES(position) >= position, VALUES(rows_done), rows_done),"
            " done = IF(VALUES(position) >= position, VALUES(done), done),"
            " updated = VALUES(updated),"
            " position = GREATEST(position, VALUES(position))",
            (job, shard, position, int(done), rows, now_us()),
        )

    def save_duplicates(self, index: str, shard: int, found: int, shown: list[Any]) -> None:
        """Record the duplicates a backfill of a unique index found on a logical shard:
        how many, and ``shown`` (JSON; at most ``MAX_SHOWN_BYTES`` of it is kept)."""
        self._save_found(unique_job(index), shard, found, shown)

    def save_unfit(self, index: str, shard: int, found: int, shown: list[Any]) -> None:
        """Record the entities a backfill set aside on a logical shard because their
        values do not fit the index (as ``save_duplicates``): it cannot become ready."""
        self._save_found(unfit_job(index), shard, found, shown)

    def _save_found(self, job: str, shard: int, found: int, shown: list[Any]) -> None:
        text = json.dumps(shown, sort_keys=True)
        while len(text) > MAX_SHOWN_BYTES and shown:
            shown = shown[: len(shown) // 2]
            text = json.dumps(shown, sort_keys=True)
        self.server.run(
            f"REPLACE INTO {self._t('checkpoints')}"
            " (job, shard, position, done, rows_done, `cursor`, updated)"
            " VALUES (%s, %s, 0, 0, %s, %s, %s)",
            (job, shard, found, text.encode(), now_us()),
        )

    def duplicates(self, index: str) -> dict[int, tuple[int, list[Any]]]:
        """``shard -> (how many, some of them)`` as recorded by ``save_duplicates``."""
        out = self.server.run(
            f"SELECT shard, rows_done, `cursor` FROM {self._t('checkpoints')} WHERE job = %s",
            (unique_job(index),),
        )
        return {int(s): (int(n), json.loads(bytes(c or b"[]"))) for s, n, c in out[0]}

    def rescan(self, index: str, shards: Iterable[int]) -> None:
        """Forget the duplicates, the backfill checkpoints and the deferrals of these
        logical shards, so that the next backfill scans them again."""
        chosen = sorted(set(shards))
        if not chosen:
            return
        marks = ", ".join(["%s"] * len(chosen))
        self.server.run(
            f"DELETE FROM {self._t('checkpoints')} WHERE job IN (%s, %s) AND shard IN ({marks});"
            f" DELETE FROM {self._t('deferrals')} WHERE index_name = %s AND source IN ({marks})",
            (unique_job(index), backfill_job(index), *chosen, index, *chosen),
        )

    def heartbeat(self, name: str, figures: dict[str, Any]) -> None:
        """Record that a daemon is alive, with its figures; forget the daemons silent
        for ``HEARTBEAT_RETENTION`` (each ``cleaner --once`` from cron is a new name)."""
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

    def dictionary(self, dict_id: int) -> bytes:
        """The data of one codec dictionary."""
        out = self.server.run(
            f"SELECT data FROM {self._t('dictionaries')} WHERE dict_id = %s", (dict_id,)
        )
        row = one(out[0])
        if row is None:
            raise CatalogError(f"codec dictionary {dict_id} is not in the catalog")
        return bytes(row[0])

    def add_dictionary(self, data: bytes, *, activate: bool = True) -> int:
        """Store a trained dictionary (ids are never reused) and make it the active one."""
        out = self.server.run(
            "START TRANSACTION;"
            f" SELECT COALESCE(MAX(dict_id), 0) + 1 INTO @next FROM {self._t('dictionaries')}"
            " FOR UPDATE;"
            f" INSERT INTO {self._t('dictionaries')} (dict_id, data, created)"
            " VALUES (@next, %s, %s);"
            + (
                f" REPLACE INTO {self._t('meta')} (name, value)"
                " VALUES ('active_dictionary', @next);"
                if activate
                else ""
            )
            + " SELECT @next; COMMIT",
            (data, now_us()),
            commits=True,
            idempotent=False,
        )
        return int(scalar(out[0]))

    # -- cleaner support ----------------------------------------------------------------

    def cursors(self, job: str) -> dict[int, tuple[int, bytes | None, bool, int]]:
        """``shard -> (position, cursor, done, rows_done)`` for a job that keeps a cursor."""
        out = self.server.run(
            f"SELECT shard, position, `cursor`, done, rows_done FROM {self._t('checkpoints')}"
            " WHERE job = %s",
            (job,),
        )
        return {
            int(s): (int(p), bytes(c) if c is not None else None, bool(d), int(n))
            for s, p, c, d, n in out[0]
        }

    def save_cursor(
        self, job: str, shard: int, position: int, cursor: bytes | None, done: bool, rows: int
    ) -> None:
        """Record a keyset cursor within round ``position``; an older round never wins."""
        self.server.run(
            f"INSERT INTO {self._t('checkpoints')}"
            " (job, shard, position, `cursor`, done, rows_done, updated)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " ON DUPLICATE KEY UPDATE"
            " `cursor` = IF(VALUES(position) >= position, VALUES(`cursor`), `cursor`),"
            " rows_done = IF(VALUES(position) >= position, VALUES(rows_done), rows_done),"
            " done = IF(VALUES(position) >= position, VALUES(done), done),"
            " updated = VALUES(updated),"
            " position = GREATEST(position, VALUES(position))",
            (job, shard, position, cursor, int(done), rows, now_us()),
        )

    # -- the shard map ------------------------------------------------------------------

    def add_server(self, address: Address) -> int:
        """Register a server (it holds no shard until one moves there); return its id."""
        out = self.server.run(
            "START TRANSACTION;"
            f" SELECT COALESCE(MAX(server_id), -1) + 1 INTO @sid FROM {self._t('servers')}"
            " FOR UPDATE;"
            f" INSERT IGNORE INTO {self._t('servers')} (server_id, host, port)"
            " VALUES (@sid, %s, %s);"
            f" SELECT server_id FROM {self._t('servers')} WHERE host = %s AND port = %s;"
            f" UPDATE {self._t('meta')} SET value = value + 1 WHERE name = 'map_version';"
            " COMMIT",
            (address.host, address.port, address.host, address.port),
            commits=True,
            idempotent=False,
        )
        return int(scalar(out[0]))

    def record_move(self, shard: int, source: int, target: int, phase: str) -> None:
        """Create or advance the record of a shard move."""
        now = now_us()
        self.server.run(
            f"INSERT INTO {self._t('moves')} (shard, source, target, phase, started, updated)"
            " VALUES (%s, %s, %s, %s, %s, %s)"
            " ON DUPLICATE KEY UPDATE phase = VALUES(phase), updated = VALUES(updated)",
            (shard, source, target, phase, now, now),
        )

    def finish_move(self, shard: int, target: int, indexes: Iterable[str], epoch: int) -> int:
        """Point a logical shard at its new server, bump the map version, forget the
        move record (one transaction); return the new map version.

        Only if the catalog still lists exactly the ``indexes`` the move copied, at the
        index ``epoch`` whose fence it copied (an index is recorded under the same
        lock, so none is declared meanwhile); otherwise nothing changes and a
        ``CatalogError`` names the difference."""
        copied = ",".join(sorted(indexes)) + f"@{int(epoch)}"
        out = self.server.run(
            f"START TRANSACTION; {self._lock_map};"
            " SELECT @names := CONCAT(COALESCE(GROUP_CONCAT(name ORDER BY name SEPARATOR ','),"
            f" ''), '@', COALESCE((SELECT value FROM {self._t('meta')}"
            f" WHERE name = 'index_epoch'), '0')) FROM {self._t('indexes')};"
            f" UPDATE {self._t('shards')} SET server_id = %s WHERE shard = %s AND @names = %s;"
            f" UPDATE {self._t('meta')} SET value = value + 1"
            " WHERE name = 'map_version' AND @names = %s;"
            f" DELETE FROM {self._t('moves')} WHERE shard = %s AND @names = %s;"
            f" SELECT value FROM {self._t('meta')} WHERE name = 'map_version';"
            " COMMIT",
            (target, shard, copied, copied, shard, copied),
            commits=True,
            idempotent=False,
        )
        names = scalar(out[1])
        if names != copied:
            now = str(names).replace("@", " at index epoch ")
            raise CatalogError(
                f"the indexes changed during the move of shard {shard} (now: {now}; "
                f"copied: {copied.replace('@', ' at index epoch ')}): move it again"
            )
        return int(scalar(out[-1]))

    def add_replica(self, server_id: int, address: Address) -> None:
        """Record a read replica of a server (replication is set up by the operator)."""
        self.server.run(
            f"INSERT IGNORE INTO {self._t('replicas')} (server_id, host, port) VALUES (%s, %s, %s)",
            (server_id, address.host, address.port),
        )

    def remove_replica(self, server_id: int, address: Address) -> None:
        """Stop sending reads to a replica."""
        self.server.run(
            f"DELETE FROM {self._t('replicas')} WHERE server_id = %s AND host = %s AND port = %s",
            (server_id, address.host, address.port),
        )

    @contextmanager
    def lock(self, name: str, busy: str, wait: float) -> Iterator[None]:
        """Hold the named lock ``name`` of this datastore, so that one process at a time
        does what it guards; ``CatalogError(busy)`` after ``wait`` seconds.  A named lock
        on the catalog server: the server also releases it when the holder's connection
        ends, so a process that dies frees it.  Driver errors are translated (by
        ``Server.connection``)."""
        full = f"schemaless:{self.prefix}:{name}".encode()
        if len(full) > 64:  # the server's limit for a lock name
            full = b"schemaless:" + hashlib.blake2b(full, digest_size=16).hexdigest().encode()
        wait = min(wait, self.server.options.read_timeout - 2)  # an answer, not a timeout
        with self.server.connection() as db:
            lock = db.string_literal(full)
            db.query(b"SELECT GET_LOCK(%s, %d), IS_USED_LOCK(%s)" % (lock, max(0, wait), lock))
            got, holder = db.store_result().fetch_row()[0]
            if got != 1:
                raise CatalogError(f"{busy} (catalog connection {holder}); try again later")
            try:
                yield
            finally:
                with suppress(Exception):  # a connection lost meanwhile took it along
                    db.query(b"DO RELEASE_LOCK(%s)" % lock)

    def cancel_move(self, shard: int) -> None:
        """Forget a move that was rolled back."""
        self.server.run(f"DELETE FROM {self._t('moves')} WHERE shard = %s", (shard,))


def _group_replicas(rows: Sequence[Sequence[Any]]) -> dict[int, tuple[Address, ...]]:
    out: dict[int, list[Address]] = {}
    for sid, host, port in rows:
        out.setdefault(int(sid), []).append(Address(str(host), int(port)))
    return {sid: tuple(addrs) for sid, addrs in out.items()}
