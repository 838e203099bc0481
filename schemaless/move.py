"""Moving a logical shard to another server while the datastore runs.

1. **Copy** every table of the shard to the target, then copy again what changed
   (a row-level diff: rows missing, different or extra on the target), online.
2. **Fence**: one atomic ``RENAME TABLE`` moves the shard's tables on the source into a
   side database.  It waits for transactions in flight; afterwards any client, even one
   with an old map, gets "table doesn't exist", refreshes its map and retries
   (``DataStore`` waits while the catalog lists a move): writers pause, they do not fail.
3. **Final sync** from the now quiescent side copy, then **verify** row counts and
   ``CHECKSUM TABLE`` on both sides.
4. **Flip** the map in the catalog (its version bumped).  The side copy stays on the
   source until ``drop_old_copies``.

Tombstones travel with the rows, so deletes made during the move do not come back.  A
move interrupted at any point can be run again: the copy converges, and a fenced side
copy is found from the move record, which names it before the rename, and finished (or
``rollback`` renames it back).  A copy without its ``entities`` table is never read
from, so a side copy that has gone fails the move instead of flipping the map.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from . import failpoints
from .catalog import Topology
from .connection import Server
from .errors import CatalogError, SchemalessError
from .index import Index
from .names import check_identifier, escape_wildcards, quote
from .results import scalar
from .scatter import chunks, sql_bytes
from .schema import changes_tables_sql, entities_table_sql, fence_table_sql
from .store import DataStore

__all__ = ["MoveReport", "ShardMover", "rebalance_plan"]

Progress = Callable[[str], None]
log = logging.getLogger(__name__)
#: At most this long, with the shard fenced, for the target's replicas to apply the
#: final sync (small: the rows that changed since the copy rounds).
_FENCED_REPLICA_WAIT = 5.0


@dataclass(frozen=True)
class _Table:
    """How to compare and copy one table of a shard."""

    name: str
    key: tuple[str, ...]  # primary key columns
    columns: tuple[str, ...]  # every column, in order
    light: tuple[str, ...]  # SQL expressions compared row by row (a digest of big columns)

    @property
    def heavy(self) -> bool:
        """Compared by digest: differing rows are fetched in full before copying."""
        return self.light != tuple(quote(c) for c in self.columns)


_ENTITIES = _Table(
    "entities",
    ("added_id",),
    ("added_id", "id", "version", "updated", "body"),
    ("`added_id`", "`id`", "`version`", "`updated`", "`body` IS NULL", "CRC32(`body`)"),
)


# The change feed's tables travel with their shard, numbers and all (nothing is emitted
# for the copy: it never writes through step 2).
_CHANGES = _Table(
    "changes",
    ("seq",),
    ("seq", "id", "version", "body", "at"),
    ("`seq`", "`id`", "`version`", "`at`", "`body` IS NULL", "CRC32(`body`)"),
)
_CHANGES_HEAD = _Table("changes_head", ("one",), ("one", "seq"), ("`one`", "`seq`"))


def _fence_table(name: str) -> _Table:
    return _Table(name, ("unused",), ("unused",), ("`unused`",))  # always empty


def _index_table(index: Index) -> _Table:
    cols = (*index.columns, "entity_id", "entity_version")
    key = index.columns if index.unique else (*index.columns, "entity_id")  # its primary key
    return _Table(index.table, key, cols, tuple(quote(c) for c in cols))


@dataclass
class MoveReport:
    """What a move did."""

    shard: int
    source: str
    target: str
    rows_copied: int = 0
    rows_deleted: int = 0
    pause_seconds: float = 0.0
    verified: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (rows, sum)
    dry_run: bool = False


class ShardMover:
    """Moves logical shards of one datastore between its servers."""

    def __init__(
        self,
        store: DataStore,
        *,
        chunk: int = 2000,
        progress: Progress | None = None,
        replica_wait: float = 60.0,
    ):
        self.store = store
        self.cluster = store.cluster
        self.chunk = chunk
        self.replica_wait = replica_wait  # for the target's replicas to apply the copy
        self.progress = progress or (lambda message: None)

    # -- planning ------------------------------------------------------------------------

    def _resolve(self, topo: Topology, target: int | str) -> int:
        if isinstance(target, int) and target in topo.servers:
            return target
        for sid, address in topo.servers.items():
            if str(address) == str(target):
                return sid
        raise CatalogError(
            f"unknown server {target!r}: known servers are "
            + ", ".join(f"{sid} ({a})" for sid, a in sorted(topo.servers.items()))
        )

    def _tables(self, topo: Topology) -> list[_Table]:
        indexes = [info.index for info in topo.indexes.values()]
        fence = [_fence_table(topo.fence)] if topo.fence else []
        feed = [_CHANGES, _CHANGES_HEAD] if topo.changes else []
        return [_ENTITIES, *(_index_table(i) for i in indexes), *feed, *fence]

    # -- the move ------------------------------------------------------------------------

    def move(self, shard: int, target: int | str, *, dry_run: bool = False) -> MoveReport:
        """Move one logical shard to ``target`` (a server id or ``host:port``).

        One process at a time moves a given shard: ``CatalogError`` if another is.
        """
        if dry_run:
            return self._move(shard, target, dry_run=True)
        with self._lock(shard):
            return self._move(shard, target, dry_run=False)

    def _move(self, shard: int, target: int | str, *, dry_run: bool) -> MoveReport:
        topo = self.cluster.refresh()
        if not 0 <= shard < topo.n_shards:
            raise CatalogError(f"no logical shard {shard}: there are {topo.n_shards}")
        dest = self._resolve(topo, target)
        record = topo.moves.get(shard)
        source = record[0] if record else topo.shard_servers[shard]
        report = MoveReport(shard, str(topo.servers[source]), str(topo.servers[dest]))
        if source == dest:
            if record:
                self.cluster.catalog.cancel_move(shard)
            self.progress(f"shard {shard} already on {report.target}")
            return report
        if dry_run:
            report.dry_run = True
            self.progress(f"would move shard {shard}: {report.source} -> {report.target}")
            return report
        if record and record[1] != dest:
            raise CatalogError(
                f"shard {shard} is being moved to server {record[1]}: finish or roll back first"
            )
        src = self.cluster.server(topo.servers[source])
        dst = self.cluster.server(topo.servers[dest])
        db = topo.dbs[shard]
        tables = self._tables(topo)
        side = _side(record[2]) if record else ""
        paused = time.monotonic()
        if not side or "entities" not in self._table_names(src, side):  # not fenced yet
            self.cluster.catalog.record_move(shard, source, dest, "copying")
            self._create(dst, db, topo)
            for round_ in (1, 2):
                copied, deleted = self._sync_all(src, db, dst, db, tables)
                report.rows_copied += copied
                report.rows_deleted += deleted
                self.progress(f"shard {shard}: copy round {round_}: {copied} rows copied")
            self._wait_replicas(topo, dest, self.replica_wait)
            side = side or self._side_name(src, db)
            paused = time.monotonic()
            self._fence(shard, (source, dest), src, db, side, tables)
        try:
            copied, deleted = self._sync_all(src, side, dst, db, tables)
            report.rows_copied += copied
            report.rows_deleted += deleted
            report.verified = self._verify(src, side, dst, db, tables)
            self._wait_replicas(topo, dest, min(self.replica_wait, _FENCED_REPLICA_WAIT))
            self.cluster.catalog.finish_move(shard, dest, topo.indexes, topo.index_epoch)
        except BaseException:
            self._rollback(shard)
            raise
        self.cluster.refresh()
        report.pause_seconds = time.monotonic() - paused
        self.progress(
            f"shard {shard}: moved to {report.target}; writes paused "
            f"{report.pause_seconds * 1000:.0f} ms; old copy kept as {side}"
        )
        return report

    def rollback(self, shard: int) -> None:
        """Undo an unfinished move: rename a fenced side copy back, forget the record."""
        with self._lock(shard):
            self._rollback(shard)

    def _lock(self, shard: int) -> AbstractContextManager[None]:
        """One process at a time moves or rolls back a shard (a few seconds' wait: the
        server may still be ending a dead mover's session)."""
        busy = f"shard {shard} is being moved or rolled back by another process"
        return self.cluster.catalog.lock(f"move:{int(shard)}", busy, wait=3)

    def _rollback(self, shard: int) -> None:
        topo = self.cluster.refresh()
        record = topo.moves.get(shard)
        if record is None:
            return
        source, _, phase = record
        side = _side(phase)
        if side:
            db = topo.dbs[shard]
            src = self.cluster.server(topo.servers[source])
            present = self._table_names(src, side)
            pairs = [
                f"{quote(side, t.name)} TO {quote(db, t.name)}"
                for t in self._tables(topo)
                if t.name in present
            ]
            if pairs:
                src.run("RENAME TABLE " + ", ".join(pairs))
        self.cluster.catalog.cancel_move(shard)
        self.cluster.refresh()

    def drop_old_copies(self) -> list[str]:
        """Drop the side copies that finished moves left on their old servers."""
        topo = self.cluster.refresh()
        fenced = {_side(p) for _, _, p in topo.moves.values()}
        # This datastore's only: another's prefix may start with this one and "_".
        ours = re.compile(re.escape(topo.prefix) + r"_[0-9]{4,}_old[0-9]+\Z")
        dropped = []
        for server in self.cluster.all_servers(topo).values():
            rows = server.run(
                "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
                (escape_wildcards(topo.prefix) + "\\_%\\_old%",),
            )[0]
            for (name,) in rows:
                if ours.match(str(name)) and name not in fenced:
                    server.run(f"DROP DATABASE IF EXISTS {quote(str(name))}")
                    dropped.append(f"{server.name}/{name}")
        return dropped

    # -- steps ---------------------------------------------------------------------------

    def _create(self, dst: Server, db: str, topo: Topology) -> None:
        stmts = [f"CREATE DATABASE IF NOT EXISTS {quote(db)}", entities_table_sql(db)]
        stmts += [info.index.create_table_sql(db) for info in topo.indexes.values()]
        if topo.index_epoch:
            stmts.append(fence_table_sql(db, topo.index_epoch))
        if topo.changes:
            stmts += changes_tables_sql(db)
        dst.run(";\n".join(stmts))

    def _fence(
        self,
        shard: int,
        servers: tuple[int, int],
        src: Server,
        db: str,
        side: str,
        tables: Sequence[_Table],
    ) -> None:
        """Rename the shard's tables into ``side``, whose name is recorded first: a mover
        that dies during the rename leaves a move that can be resumed or rolled back."""
        catalog = self.cluster.catalog
        catalog.record_move(shard, *servers, f"fencing:{side}")
        present = self._table_names(src, db)
        pairs = [
            f"{quote(db, t.name)} TO {quote(side, t.name)}" for t in tables if t.name in present
        ]
        src.run(
            f"CREATE DATABASE IF NOT EXISTS {quote(side)};"
            " SET SESSION lock_wait_timeout = 10;"
            f" RENAME TABLE {', '.join(pairs)};"
            " SET SESSION lock_wait_timeout = DEFAULT"
        )
        failpoints.hit("move.after_fence")
        catalog.record_move(shard, *servers, f"fenced:{side}")

    def _wait_replicas(self, topo: Topology, dest: int, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until the target's replicas have applied
        everything written to it so far: once the map flips, replica reads of the shard
        go there, and a copy makes old rows new to the binary log, so a replica within
        its lag bound could still miss rows written long ago."""
        replicas = topo.replicas.get(dest, ())
        if not replicas:
            return
        dst = self.cluster.server(topo.servers[dest])
        position = scalar(dst.run("SELECT @@gtid_binlog_pos")[0])
        for address in replicas:
            try:
                done = scalar(
                    self.cluster.server(address).run(
                        "SELECT MASTER_GTID_WAIT(%s, %s)", (position, float(timeout))
                    )[0]
                )
            except SchemalessError as exc:
                done = exc
            if done != 0:
                log.warning(
                    "replica %s of %s has not applied the copy after %.0fs (%s): replica "
                    "reads of the shard may miss rows until it has",
                    address,
                    dst.name,
                    timeout,
                    "timed out" if done == -1 else done,
                )

    @staticmethod
    def _side_name(src: Server, db: str) -> str:
        """A new side database for ``db`` on ``src``: ``<db>_old<unix time>``, the time
        bumped past the names an earlier move of the shard left there."""
        rows = src.run(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
            (escape_wildcards(db) + "\\_old%",),
        )[0]
        taken = {str(r[0]) for r in rows}
        stamp = int(time.time())
        while f"{db}_old{stamp}" in taken:
            stamp += 1
        return check_identifier(f"{db}_old{stamp}", "database")

    @staticmethod
    def _table_names(server: Server, db: str) -> set[str]:
        rows = server.run(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (db,)
        )[0]
        return {str(r[0]) for r in rows}

    def _present(self, src: Server, db: str) -> set[str]:
        """The tables of a shard's copy to read from, which has its entities at least."""
        present = self._table_names(src, db)
        if "entities" not in present:
            raise CatalogError(f"{db} on {src.name} has no entities table: nothing to copy")
        return present

    def _sync_all(
        self, src: Server, src_db: str, dst: Server, dst_db: str, tables: Sequence[_Table]
    ) -> tuple[int, int]:
        present = self._present(src, src_db)
        copied = deleted = 0
        for table in tables:
            if table.name in present:
                c, d = self._sync(src, src_db, dst, dst_db, table)
                copied += c
                deleted += d
        return copied, deleted

    def _sync(
        self, src: Server, src_db: str, dst: Server, dst_db: str, table: _Table
    ) -> tuple[int, int]:
        """Make the target table equal to the source table, chunk by chunk."""
        keys = [quote(c) for c in table.key]
        order = ", ".join(keys)
        light = ", ".join(table.light)
        n_key = len(table.key)
        last: tuple[Any, ...] | None = None
        copied = deleted = 0
        while True:
            after, params = _after(keys, last)
            src_rows = src.run(
                f"SELECT {light} FROM {quote(src_db, table.name)} WHERE {after}"
                f" ORDER BY {order} LIMIT {int(self.chunk)}",
                params,
            )[0]
            upto, upto_params = "TRUE", list[Any]()  # the last chunk: every later target row too
            if len(src_rows) == self.chunk:
                upto, upto_params = _upto(keys, tuple(src_rows[-1][:n_key]))
            dst_rows = dst.run(
                f"SELECT {light} FROM {quote(dst_db, table.name)} WHERE {after} AND {upto}",
                [*params, *upto_params],
            )[0]
            theirs = {tuple(r[:n_key]): tuple(r) for r in dst_rows}
            need = [tuple(r) for r in src_rows if theirs.pop(tuple(r[:n_key]), None) != tuple(r)]
            if need:
                copied += self._copy(src, src_db, dst, dst_db, table, need)
            if theirs:
                deleted += len(theirs)
                where = " AND ".join(f"{k} = %s" for k in keys)
                dst.run(
                    ";".join(
                        [f"DELETE FROM {quote(dst_db, table.name)} WHERE {where}"] * len(theirs)
                    ),
                    [v for key in theirs for v in key],
                )
            if len(src_rows) < self.chunk:
                return copied, deleted
            last = tuple(src_rows[-1][:n_key])

    def _copy(
        self,
        src: Server,
        src_db: str,
        dst: Server,
        dst_db: str,
        table: _Table,
        rows: list[tuple[Any, ...]],
    ) -> int:
        if table.heavy:  # fetch the full rows (bodies) by primary key
            ids = [r[0] for r in rows]
            rows = [
                tuple(r)
                for r in src.run(
                    f"SELECT {', '.join(quote(c) for c in table.columns)}"
                    f" FROM {quote(src_db, table.name)}"
                    f" WHERE {quote(table.key[0])} IN ({', '.join(['%s'] * len(ids))})",
                    ids,
                )[0]
            ]
        one = "(" + ", ".join(["%s"] * len(table.columns)) + ")"
        for part in chunks(rows, sql_bytes, self.cluster.max_batch_bytes):
            dst.run(
                f"REPLACE INTO {quote(dst_db, table.name)}"
                f" ({', '.join(quote(c) for c in table.columns)}) VALUES "
                + ", ".join([one] * len(part)),
                [v for r in part for v in r],
            )
        return len(rows)

    def _verify(
        self, src: Server, src_db: str, dst: Server, dst_db: str, tables: Sequence[_Table]
    ) -> dict[str, tuple[int, int]]:
        """Row counts and CHECKSUM TABLE must agree on both sides."""
        present = self._present(src, src_db)
        out = {}
        for table in tables:
            if table.name not in present:
                continue
            sums = []
            for server, db in ((src, src_db), (dst, dst_db)):
                t = quote(db, table.name)
                got = server.run(f"SELECT COUNT(*) FROM {t}; CHECKSUM TABLE {t}")
                sums.append((int(scalar(got[0])), int(got[1][0][1] or 0)))
            if sums[0] != sums[1]:
                raise CatalogError(
                    f"verification failed for {table.name}: source {sums[0]} != target {sums[1]}"
                )
            out[table.name] = sums[0]
        return out


def _side(phase: str) -> str:
    """The side database a move's phase names (``fencing:`` or ``fenced:``), or ""."""
    kind, _, side = phase.partition(":")
    return check_identifier(side, "database") if kind in ("fencing", "fenced") else ""


def _after(keys: list[str], last: tuple[Any, ...] | None) -> tuple[str, list[Any]]:
    """``(keys) > last`` as an index-friendly OR of ANDs."""
    if last is None:
        return "TRUE", []
    ors, params = [], []
    for i, col in enumerate(keys):
        ors.append("(" + " AND ".join([*(f"{k} = %s" for k in keys[:i]), f"{col} > %s"]) + ")")
        params += [*last[:i], last[i]]
    return "(" + " OR ".join(ors) + ")", params


def _upto(keys: list[str], last: tuple[Any, ...]) -> tuple[str, list[Any]]:
    """``(keys) <= last``."""
    ors, params = [], []
    for i, col in enumerate(keys):
        ors.append("(" + " AND ".join([*(f"{k} = %s" for k in keys[:i]), f"{col} < %s"]) + ")")
        params += [*last[:i], last[i]]
    ors.append("(" + " AND ".join(f"{k} = %s" for k in keys) + ")")
    params += list(last)
    return "(" + " OR ".join(ors) + ")", params


def rebalance_plan(topo: Topology) -> list[tuple[int, int, int]]:
    """Moves ``(shard, from server, to server)`` that even out shards per server."""
    load = {sid: topo.shards_of(sid) for sid in topo.servers}
    moves: list[tuple[int, int, int]] = []
    while True:
        most = max(load, key=lambda sid: (len(load[sid]), -sid))
        least = min(load, key=lambda sid: (len(load[sid]), sid))
        if len(load[most]) - len(load[least]) <= 1:
            return moves
        shard = load[most].pop()
        load[least].append(shard)
        moves.append((shard, most, least))
