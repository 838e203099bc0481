"""The write protocol in today's layout and in ``d_owned`` (issue 39, step 1).

Each layout runs the protocol's statements as the library sends them, per round trip:
step 1 (the index rows on other servers than the entity's, one batch per server,
servers in parallel), step 2 (one batch on the entity's server: its index rows there,
the old body read, the conditional write, one transaction) and step 3 (the old body's
rows deleted where ``entity_version < V``, one batch per server).  Today's statements
come from ``schemaless.writes`` itself (a database per logical shard, the index epoch's
fence table named by every body); ``d_owned``'s from ``bench.ownedsql`` (one database
per server, every write guarded by the shard's ``owned`` row; the variants of
``GUARDS`` guard otherwise, or not at all).  The operations: a put of a new entity, an
update (a blind put that moves ``published``, so two of three indexes change rows) and
a delete (a tombstone), each with 0, 1 and 3 indexes (``bench.ops.INDEXES``: i0, i1,
i3) and with one unique index (u1: step 1 claims the value and reads its owner back,
as ``schemaless.unique`` does; in ``d_owned`` that read's batch ends with the count).
A write that does not apply, or a claim not held, fails the run.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

from schemaless import writes as today
from schemaless.codec import Codec
from schemaless.hashing import shard_of
from schemaless.index import Index
from schemaless.schema import entities_table_sql, fence_table, fence_table_sql
from schemaless.writes import BLIND, NEW, EntityWrite, IndexRow

from . import ownedsql
from .data import Dataset
from .env import RawClient
from .layouts import Placement
from .ops import INDEXES

__all__ = [
    "GUARDS",
    "WRITE_LAYOUTS",
    "WRITE_OPS",
    "WRITE_SETS",
    "OwnedWrites",
    "TodayWrites",
    "cells",
    "owned_db",
]

#: the cells' index sets: bench.ops's, and one unique index (a claim in step 1)
UNIQUE = Index("by_published", {"published": "int"}, unique=True)
SETS: dict[str, list[Index]] = {**{k: INDEXES[k] for k in ("i0", "i1", "i3")}, "u1": [UNIQUE]}
ALL_INDEXES = [*INDEXES["i3"], UNIQUE]
WRITE_SETS = tuple(SETS)
MOVED = 10**7  # an update moves ``published`` by this, past every entity's (unique)
WRITE_OPS = ("put", "update", "delete")
#: the owned layout's guards and their write layouts' names
GUARDS = {"row": "d_owned", "head": "d_head", "trigger": "d_trigger", "none": "d_none"}
WRITE_LAYOUTS = ("today", *GUARDS.values())
FENCE = fence_table(1)
Batch = tuple[str, list[Any]]


class TodayWrites:
    """Today's layout: the library's own builders over a database per logical shard."""

    name = "today"

    def __init__(self, place: Placement, raw: RawClient) -> None:
        self.place, self.raw = place, raw
        self.dbs = [place.shard_db(s) for s in range(place.n_shards)]

    def ddl(self, sid: int) -> list[str]:
        out = []
        for shard in self.place.shards_on(sid):
            db = self.dbs[shard]
            out += [f"CREATE DATABASE IF NOT EXISTS `{db}`", entities_table_sql(db)]
            out += [index.create_table_sql(db) for index in ALL_INDEXES]
            out.append(fence_table_sql(db, 1))
        return out

    def upserts(self, rows: list[IndexRow]) -> Batch:
        return today.upsert_rows_sql(rows, self.dbs)

    def claims(self, rows: list[IndexRow]) -> Batch:
        """Step 1 with a unique index, as ``schemaless.unique`` claims: the upserts,
        then the owners of the unique rows' values (one ``SELECT`` per table)."""
        sql, params = self.upserts(rows)
        stmts = [sql]
        for shard, index, values in _unique_groups(rows):
            more_sql, more = today.owners_sql(self.db_name(shard), index, values)
            stmts.append(more_sql)
            params += more
        return self.read_batch(stmts, rows), params

    def db_name(self, shard: int) -> str:
        return self.dbs[shard]

    def read_batch(self, stmts: list[str], rows: list[IndexRow]) -> str:
        return ";\n".join(stmts)

    def stale(self, sets: list[Any], rows: list[IndexRow]) -> bool:
        """Whether a read batch's results show a shard not owned (never, today: the
        statements fail instead)."""
        return False

    def deletes(self, rows: list[IndexRow]) -> Batch:
        return today.delete_rows_sql(rows, self.dbs)

    def entity(self, w: EntityWrite, rows: list[IndexRow]) -> tuple[str, list[Any], int]:
        return today.entity_batch_sql([w], rows, self.dbs, FENCE)


class OwnedWrites(TodayWrites):
    """``d_owned``: one database per server, every write guarded by the ``owned`` row
    (``guard``: ``row``, or a variant of ``GUARDS``; ``bench.ownedsql``)."""

    def __init__(self, place: Placement, raw: RawClient, guard: str = "row") -> None:
        super().__init__(place, raw)
        self.name = GUARDS[guard]
        self.db = ownedsql.OwnedDb(owned_db(place, guard), guard)

    def ddl(self, sid: int) -> list[str]:
        return self.db.ddl(ALL_INDEXES, self.place.shards_on(sid), FENCE)

    def upserts(self, rows: list[IndexRow]) -> Batch:
        return ownedsql.upsert_rows_sql(self.db, rows)

    def db_name(self, shard: int) -> str:
        return self.db.name

    def read_batch(self, stmts: list[str], rows: list[IndexRow]) -> str:
        return ownedsql.read_batch(self.db, stmts, [r.shard for r in rows])

    def stale(self, sets: list[Any], rows: list[IndexRow]) -> bool:
        return ownedsql.stale_shards(sets, [r.shard for r in rows])

    def deletes(self, rows: list[IndexRow]) -> Batch:
        return ownedsql.delete_rows_sql(self.db, rows)

    def entity(self, w: EntityWrite, rows: list[IndexRow]) -> tuple[str, list[Any], int]:
        return ownedsql.entity_batch_sql(self.db, [w], rows, FENCE)


Layout = TodayWrites  # the write layouts' common type


def owned_db(place: Placement, guard: str) -> str:
    """The database of an owned write layout (``d_owned``'s is the read layout's)."""
    return place.one_db if guard == "row" else f"{place.prefix}_{guard}"


class Protocol:
    """Steps 1-3 of one entity's write, on one layout."""

    def __init__(self, layout: Layout, codec: Codec, versions: Iterable[int]) -> None:
        self.layout, self.codec, self.versions = layout, codec, iter(versions)
        self.place = layout.place

    def rows(self, entity: dict[str, Any], set_name: str, version: int) -> list[IndexRow]:
        n = self.place.n_shards
        return [
            IndexRow(index, shard_of(index.shard_key(row), n), row, entity["id"], version)
            for index in SETS[set_name]
            for row in sorted(index.rows(entity))
        ]

    def write(self, entity: dict[str, Any], set_name: str, kind: str) -> None:
        """Put (``new``), update (``blind``) or delete ``entity``; fails unless applied."""
        key, version = entity["id"], next(self.versions)
        shard = shard_of(key, self.place.n_shards)
        home = self.place.sid(shard)
        body = None if kind == "delete" else self.codec.encode(entity)
        new = self.rows(entity, set_name, version) if body is not None else []
        local = [r for r in new if not r.index.unique and self.place.sid(r.shard) == home]
        remote = [r for r in new if r not in local]  # a unique claim is settled in step 1
        if any(r.index.unique for r in remote):
            self._claim(remote)
        else:
            self._fan(self.layout.upserts, remote)
        want = bool(SETS[set_name]) and kind != "new"
        w = EntityWrite(
            self.layout.dbs[shard], shard, key, version, version, body,
            NEW if kind == "new" else BLIND, want,
        )  # fmt: skip
        sql, params, first = self.layout.entity(w, local)
        sets, counts = self.layout.raw.run_counts(home, sql, params)
        if counts[first] <= 0:
            raise AssertionError(f"{self.layout.name}: a {kind} did not apply")
        if want and sets[0] and sets[0][0][0] is not None:
            old = self.rows(self.codec.decode(sets[0][0][0]), set_name, version)
            keep = {(r.index.name, r.values) for r in new}
            self._fan(self.layout.deletes, [r for r in old if (r.index.name, r.values) not in keep])

    def _fan(self, build: Callable[[list[IndexRow]], Batch], rows: list[IndexRow]) -> None:
        by_sid = self._by_server(rows)
        if by_sid:
            self.layout.raw.fanout({sid: build(group) for sid, group in by_sid.items()})

    def _claim(self, rows: list[IndexRow]) -> None:
        """Step 1 with unique rows: each must be this entity's after it (no contest
        here), and the batch's count must show its shards owned."""
        by_sid = self._by_server(rows)
        results = self.layout.raw.fanout(
            {sid: self.layout.claims(group) for sid, group in by_sid.items()}
        )
        for sid, sets in results.items():
            owners = {bytes(r[-2]) for found in sets for r in found if len(r) >= 3}
            mine = {r.entity_id for r in by_sid[sid] if r.index.unique}
            if self.layout.stale(sets, by_sid[sid]) or not mine <= owners:
                raise AssertionError(f"{self.layout.name}: a unique claim was not held")

    def _by_server(self, rows: list[IndexRow]) -> dict[int, list[IndexRow]]:
        by_sid: dict[int, list[IndexRow]] = {}
        for row in rows:
            by_sid.setdefault(self.place.sid(row.shard), []).append(row)
        return by_sid


def _unique_groups(rows: list[IndexRow]) -> list[tuple[int, Index, list[tuple[Any, ...]]]]:
    """(shard, index, values) of each unique index table the rows name."""
    groups: dict[tuple[int, str], list[IndexRow]] = {}
    for row in rows:
        if row.index.unique:
            groups.setdefault((row.shard, row.index.name), []).append(row)
    return [(s, g[0].index, [r.values for r in g]) for (s, _), g in sorted(groups.items())]


def create(layout: Layout) -> None:
    for sid in range(layout.place.servers):
        layout.raw.run(sid, ";\n".join(layout.ddl(sid)))


def _entities(ds: Dataset, start: int, count: int) -> list[dict[str, Any]]:
    return [ds.entity(i) for i in range(start, start + count)]


def _moved(entity: dict[str, Any]) -> dict[str, Any]:
    return {**entity, "published": entity["published"] + MOVED}


def cells(
    place: Placement, raw: RawClient, codec: Codec, per_cell: int, warm: int
) -> tuple[dict[str, dict[str, Callable[[Any], object]]], dict[str, list[Any]], list[Layout]]:
    """Create both layouts' tables and preload them; the write cells (``put i1``, ...),
    each a call per layout, and their items (``per_cell + warm`` each, every one used
    once per layout: the first ``warm`` for the warm-up)."""
    layouts: list[Layout] = [TodayWrites(place, raw)]
    layouts += [OwnedWrites(place, raw, guard) for guard in GUARDS]
    n = per_cell + warm
    ds = Dataset(3 * len(WRITE_SETS) * n)
    clock = itertools.count(time.time_ns() // 1000)
    protos = [Protocol(layout, codec, clock) for layout in layouts]
    calls: dict[str, dict[str, Callable[[Any], object]]] = {}
    items: dict[str, list[Any]] = {}
    for layout in layouts:
        create(layout)
    for k, set_name in enumerate(WRITE_SETS):
        base = 3 * k * n
        olds = _entities(ds, base + n, 2 * n)  # preloaded: updated, then deleted
        for proto, e in itertools.product(protos, olds):
            proto.write(e, set_name, "new")
        items[f"put {set_name}"] = _entities(ds, base, n)
        items[f"update {set_name}"] = [_moved(e) for e in olds[:n]]
        items[f"delete {set_name}"] = olds[n:]
        for op, kind in zip(WRITE_OPS, ("new", "blind", "delete"), strict=True):
            calls[f"{op} {set_name}"] = {p.layout.name: _writer(p, set_name, kind) for p in protos}
    return calls, items, layouts


def _writer(proto: Protocol, set_name: str, kind: str) -> Callable[[Any], object]:
    return lambda entity: proto.write(entity, set_name, kind)


def counts(layout: Layout) -> list[int]:
    """Live entities, tombstones and each index's rows, summed over the servers (every
    layout must hold the same after the same writes)."""
    place, out = layout.place, [0] * (2 + len(ALL_INDEXES))
    for sid in range(place.servers):
        if isinstance(layout, OwnedWrites):
            dbs = [layout.db]
        else:
            dbs = [ownedsql.OwnedDb(layout.dbs[shard]) for shard in place.shards_on(sid)]
        for db in dbs:
            sql = [f"SELECT SUM(`body` IS NOT NULL), SUM(`body` IS NULL) FROM {db.entities}"]
            sql += [f"SELECT COUNT(*) FROM {db.table(i.table)}" for i in ALL_INDEXES]
            sets = layout.raw.run(sid, ";\n".join(sql))
            got = [int(sets[0][0][0] or 0), int(sets[0][0][1] or 0)]
            got += [int(rows[0][0]) for rows in sets[1:]]
            out = [x + y for x, y in zip(out, got, strict=True)]
    return out
