"""Moving a logical shard to another server while the datastore runs.

1. **Copy** every table of the shard to the target, then copy again what changed
   (a row-level diff, ``schemaless.movesync``: rows missing, different or extra on the
   target), online.
2. **Fence**.  Owned layout: delete the source's ``owned`` row of the shard, which waits
   for the shard's writers (their guard triggers hold it under a shared lock);
   afterwards the source refuses the shard's writes and fails its reads.  A database
   per shard: one atomic ``RENAME TABLE`` moves the shard's tables on the source into a
   side database.  Either way a client, even one with an old map, gets "table doesn't
   exist", refreshes its map and retries (``DataStore`` waits while the catalog lists a
   move): writers pause, they do not fail.
3. **Final sync** from the now quiescent source, then **verify** row counts and digests
   on both sides.
4. **Flip** the map in the catalog (its version bumped), the target's ``owned`` row
   inserted first (owned layout).  The old copy stays on the source until
   ``drop_old_copies``: the owned layout's rows of a shard on a server that does not
   hold it, deleted in throttled chunks; otherwise the side database.

Tombstones travel with the rows, so deletes made during the move do not come back.  A
move interrupted at any point can be run again or rolled back from its record: the copy
converges; the owned layout's fence is idempotent, and a rollback puts the source's
``owned`` row back and deletes the target's copied rows; a fenced side copy is found
from the move record, which names it before the rename, and finished (or renamed
back).  A copy without its ``entities`` table is never read from, so a side copy that
has gone fails the move instead of flipping the map.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from . import failpoints, owned
from .catalog import Topology
from .connection import Server
from .dsn import Address
from .errors import CatalogError, SchemalessError, ShardUnavailable
from .movesync import (
    Side,
    Syncer,
    Table,
    copy_wide,
    create_missing,
    discovered,
    shard_tables,
    table_names,
)
from .names import check_identifier, escape_wildcards, quote
from .owned import admin
from .results import scalar
from .schema import changes_tables_sql, entities_table_sql, fence_epoch, fence_table_sql
from .store import DataStore

__all__ = ["MoveReport", "ShardMover", "rebalance_plan"]

Progress = Callable[[str], None]
log = logging.getLogger(__name__)
#: At most this long, with the shard fenced, for the target's replicas to apply the
#: final sync (small: the rows that changed since the copy rounds).
_FENCED_REPLICA_WAIT = 5.0


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
        pause: float = 0.05,
    ):
        self.store = store
        self.cluster = store.cluster
        self.chunk = chunk
        self.replica_wait = replica_wait  # for the target's replicas to apply the copy
        self.pause = pause  # between two deletes of an old copy's rows (owned layout)
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

    def _syncer(self) -> Syncer:
        return Syncer(self.chunk, self.cluster.max_batch_bytes)

    def _pair(self, topo: Topology, source: int, dest: int) -> tuple[Server, Server]:
        return self.cluster.server(topo.servers[source]), self.cluster.server(topo.servers[dest])

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
        if topo.owned_db is None:
            kept = self._move_databases(topo, shard, (source, dest), report)
        else:
            kept = self._move_owned(topo, shard, (source, dest), report)
        self.cluster.refresh()
        self.progress(
            f"shard {shard}: moved to {report.target}; writes paused "
            f"{report.pause_seconds * 1000:.0f} ms; {kept}"
        )
        return report

    def _move_databases(
        self, topo: Topology, shard: int, servers: tuple[int, int], report: MoveReport
    ) -> str:
        """A database per logical shard: fenced by renaming its tables away."""
        record = topo.moves.get(shard)
        src, dst = self._pair(topo, *servers)
        db = topo.dbs[shard]
        tables = shard_tables(topo)
        side = _side(record[2]) if record else ""
        paused = time.monotonic()
        if not side or "entities" not in table_names(src, side):  # not fenced yet
            self.cluster.catalog.record_move(shard, *servers, "copying")
            self._create(dst, db, topo)
            self._copy_rounds(shard, Side(src, db), Side(dst, db), tables, report)
            self._wait_replicas(topo, servers[1], self.replica_wait)
            side = side or self._side_name(src, db)
            paused = time.monotonic()
            self._fence(shard, servers, src, db, side, tables)
        self._flip(topo, shard, servers, Side(src, side), Side(dst, db), report)
        report.pause_seconds = time.monotonic() - paused
        return f"old copy kept as {side}"

    def _move_owned(
        self, topo: Topology, shard: int, servers: tuple[int, int], report: MoveReport
    ) -> str:
        """The owned layout: fenced by deleting the source's ``owned`` row (the copy
        rounds are skipped when a resumed move finds it gone already)."""
        catalog = self.cluster.catalog
        src, dst = self._pair(topo, *servers)
        db = str(topo.owned_db)
        here, there = Side(src, db, shard), Side(dst, db, shard)
        self._prepare(dst, topo)
        extra, wide = discovered(src, db, {t.name for t in shard_tables(topo)})
        create_missing(src, dst, db, extra)
        copy_wide(src, dst, db, wide)
        if self._owns(src, db, shard):
            catalog.record_move(shard, *servers, "copying")
            self._copy_rounds(shard, here, there, self._tables(topo, src), report)
            failpoints.hit("move.after_copy")
            self._wait_replicas(topo, servers[1], self.replica_wait)
        paused = time.monotonic()
        catalog.record_move(shard, *servers, "fencing")
        src.run(admin([owned.disown_sql(db, shard)]))  # waits for the shard's writers
        failpoints.hit("move.after_fence")
        catalog.record_move(shard, *servers, "fenced")
        self._flip(topo, shard, servers, here, there, report)
        report.pause_seconds = time.monotonic() - paused
        return "old rows kept until drop-old"

    def _flip(
        self,
        topo: Topology,
        shard: int,
        servers: tuple[int, int],
        src: Side,
        dst: Side,
        report: MoveReport,
    ) -> None:
        """Final sync and verify from the fenced source, the target's ``owned`` row
        (owned layout: before its replicas are waited for, which must have it too),
        then the map flips; anything failing rolls the move back."""
        try:
            self._final_sync(src, dst, self._tables(topo, src.server), report)
            if topo.owned_db is not None:
                dst.server.run(admin(owned.owned_rows_sql(dst.db, [shard], changes=False)))
                failpoints.hit("move.after_owned")
            self._wait_replicas(topo, servers[1], min(self.replica_wait, _FENCED_REPLICA_WAIT))
            self.cluster.catalog.finish_move(shard, servers[1], topo.indexes, topo.index_epoch)
        except BaseException:
            self._rollback(shard)
            raise

    def _copy_rounds(
        self, shard: int, src: Side, dst: Side, tables: Sequence[Table], report: MoveReport
    ) -> None:
        """The online copy, twice: the second round copies what changed during the first."""
        sync = self._syncer()
        for round_ in (1, 2):
            copied, deleted = sync.sync_all(src, dst, tables)
            report.rows_copied += copied
            report.rows_deleted += deleted
            self.progress(f"shard {shard}: copy round {round_}: {copied} rows copied")

    def _final_sync(
        self, src: Side, dst: Side, tables: Sequence[Table], report: MoveReport
    ) -> None:
        """Copy what changed until the fence, then verify; again (three times at most)
        if a delete that passed its ownership check before the fence commits meanwhile
        (deletes are not guarded)."""
        sync = self._syncer()
        for attempt in range(3):
            copied, deleted = sync.sync_all(src, dst, tables)
            report.rows_copied += copied
            report.rows_deleted += deleted
            failpoints.hit("move.before_verify")
            try:
                report.verified = sync.verify(src, dst, tables)
                return
            except CatalogError:
                if attempt == 2:
                    raise

    def rollback(self, shard: int) -> None:
        """Undo an unfinished move: the source holds the shard again (its ``owned``
        row back, or its fenced side copy renamed back), the record is forgotten."""
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
        if topo.owned_db is None:
            self._rename_back(topo, shard, record)
        else:
            self._give_back(topo, shard, record)
        self.cluster.catalog.cancel_move(shard)
        self.cluster.refresh()

    def _rename_back(self, topo: Topology, shard: int, record: tuple[int, int, str]) -> None:
        source, _, phase = record
        side = _side(phase)
        if side:
            db = topo.dbs[shard]
            src = self.cluster.server(topo.servers[source])
            present = table_names(src, side)
            pairs = [
                f"{quote(side, t.name)} TO {quote(db, t.name)}"
                for t in shard_tables(topo)
                if t.name in present
            ]
            if pairs:
                src.run("RENAME TABLE " + ", ".join(pairs))

    def _give_back(self, topo: Topology, shard: int, record: tuple[int, int, str]) -> None:
        """Owned layout: the target's ``owned`` row (if the move got that far) goes,
        the source's comes back, then the target's copied rows are deleted."""
        src, dst = self._pair(topo, record[0], record[1])
        db = str(topo.owned_db)
        there = "owned" in table_names(dst, db)
        if there:
            dst.run(admin([owned.disown_sql(db, shard)]))
        src.run(admin(owned.owned_rows_sql(db, [shard], changes=False)))
        failpoints.hit("move.rollback.after_owned")
        if there:
            self._syncer().delete(Side(dst, db, shard), self._tables(topo, dst), self.pause)

    def drop_old_copies(self) -> list[str]:
        """Remove the old copies that finished (or rolled back) moves left: the owned
        layout's rows of shards a server does not hold, in throttled chunks; the side
        databases of a database per shard."""
        topo = self.cluster.refresh()
        dropped: list[str] = []
        failed: list[str] = []
        for sid, server in self.cluster.all_servers(topo).items():
            try:
                if topo.owned_db is not None:
                    dropped += self._drop_old_rows(topo, topo.owned_db, sid, server)
                else:
                    dropped += self._drop_old_sides(topo, server)
            except ShardUnavailable:
                failed.append(server.name)
        if failed:
            raise ShardUnavailable(
                f"{len(dropped)} old copies dropped on the servers that answered;"
                f" {', '.join(failed)} did not: run `schemaless shards drop-old` again once"
                " they answer"
            )
        return dropped

    def _drop_old_sides(self, topo: Topology, server: Server) -> list[str]:
        """A database per shard: drop a server's side databases no move names."""
        fenced = {_side(p) for _, _, p in topo.moves.values()}
        # This datastore's only: another's prefix may start with this one and "_".
        ours = re.compile(re.escape(topo.prefix) + r"_[0-9]{4,}_old[0-9]+\Z")
        rows = server.run(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
            (escape_wildcards(topo.prefix) + "\\_%\\_old%",),
        )[0]
        dropped = []
        for (name,) in rows:
            if ours.match(str(name)) and name not in fenced:
                server.run(f"DROP DATABASE IF EXISTS {quote(str(name))}")
                dropped.append(f"{server.name}/{name}")
        return dropped

    def _drop_old_rows(self, topo: Topology, db: str, sid: int, server: Server) -> list[str]:
        """Delete a server's rows of the shards it does not hold and no move names, a
        shard at a time under its move lock (a move of it waits meanwhile)."""
        dropped = []
        tables = self._tables(topo, server)
        for shard in sorted(self._held(server, db, tables) - set(topo.shards_of(sid))):
            if shard in topo.moves:
                continue
            with self._lock(shard):
                now = self.cluster.refresh()
                if shard in now.moves or now.shard_servers[shard] == sid:
                    continue
                rows = self._syncer().delete(Side(server, db, shard), tables, self.pause)
                failpoints.hit("move.after_drop")
            dropped.append(f"{server.name}/{db} shard {shard} ({rows:,} rows)")
        return dropped

    @staticmethod
    def _tables(topo: Topology, server: Server) -> list[Table]:
        """The tables a move copies: the library's (``shard_tables``) and, in the owned
        layout, the data database's other shard tables (made on first use by
        ``schemaless.edges`` and ``schemaless.feeds``), as the server has them."""
        tables = shard_tables(topo)
        if topo.owned_db is not None:
            tables += discovered(server, topo.owned_db, {t.name for t in tables})[0]
        return tables

    @staticmethod
    def _held(server: Server, db: str, tables: Sequence[Table]) -> set[int]:
        """The logical shards a server has rows of, owned or not: per table, a skip
        scan of its ``shard`` key (one index dive a shard, whatever the rows)."""
        present = table_names(server, db)
        parts = []
        for t in tables:
            if t.name in present:
                name = quote(db, t.name)
                parts.append(
                    f"WITH RECURSIVE s (n) AS (SELECT MIN(`shard`) FROM {name} UNION ALL"
                    f" SELECT (SELECT MIN(`shard`) FROM {name} WHERE `shard` > s.n) FROM s"
                    " WHERE s.n IS NOT NULL) SELECT n FROM s WHERE n IS NOT NULL"
                )
        if not parts:
            return set()
        return {int(r[0]) for rows in server.run(admin(parts)) for r in rows}

    @staticmethod
    def _owns(server: Server, db: str, shard: int) -> bool:
        rows = server.run(
            admin([f"SELECT COUNT(*) FROM {quote(db, 'owned')} WHERE `shard` = {int(shard)}"])
        )
        return bool(scalar(rows[0]))

    # -- steps ---------------------------------------------------------------------------

    def prepare_server(self, address: Address) -> None:
        """Owned layout: create the data database's tables on a server before it is
        added to the datastore (nothing to do for a database per shard, whose moves
        create the shard's database)."""
        topo = self.cluster.refresh()
        if topo.owned_db is not None:
            self._prepare(self.cluster.server(address), topo)

    def _prepare(self, server: Server, topo: Topology) -> None:
        """The owned layout's tables a server that is to hold shards lacks (only those:
        DDL on a table in use waits for its transactions), and the index epoch's fence
        on a server that has no fence yet (one that has keeps what declarations made).
        A dropped index's table too, until it is purged: a move copies every index's."""
        db = str(topo.owned_db)
        names = table_names(server, db)
        stmts = [] if "entities" in names else owned.entities_table_sql(db)
        for index in (info.index for info in topo.indexes.values()):
            if index.table not in names:
                stmts += owned.index_table_sql(db, index)
        if topo.changes and "changes" not in names:
            stmts += owned.changes_tables_sql(db)
        if topo.index_epoch and not any(fence_epoch(t) is not None for t in names):
            stmts.append(fence_table_sql(db, topo.index_epoch))
        if stmts:
            server.run(admin(stmts))

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
        tables: Sequence[Table],
    ) -> None:
        """Rename the shard's tables into ``side``, whose name is recorded first: a mover
        that dies during the rename leaves a move that can be resumed or rolled back."""
        catalog = self.cluster.catalog
        catalog.record_move(shard, *servers, f"fencing:{side}")
        present = table_names(src, db)
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


def _side(phase: str) -> str:
    """The side database a move's phase names (``fencing:`` or ``fenced:``), or ""."""
    kind, _, side = phase.partition(":")
    return check_identifier(side, "database") if kind in ("fencing", "fenced") else ""


def rebalance_plan(topo: Topology) -> list[tuple[int, int, int]]:
    """Moves ``(shard, from server, to server)`` that even out shards per server;
    ``CatalogError`` while a move is unfinished (the map would be planned wrong: its
    shard is neither here nor there yet)."""
    if topo.moves:
        raise CatalogError(
            "finish or undo the unfinished moves first: " + "; ".join(topo.move_hints())
        )
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
