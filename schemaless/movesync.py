"""The row-level diff of a shard move: make the target's copy of a logical shard equal
to the source's, chunk by chunk, verify it, and delete a copy in throttled chunks.

A :class:`Side` is one server's copy: in the layout of a database per logical shard
its database's whole tables; in the owned layout the rows ``WHERE shard = s`` of the
server's data database, which the copy writes with ``@schemaless_copying = s`` (the
guard triggers let those through before the target owns the shard).  Every batch is
administrative (``owned.admin``): a move reads and writes a shard no client may.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .batch import Batch, gather
from .connection import Server
from .edgetables import triggers_sql
from .errors import CatalogError
from .index import Index
from .names import quote
from .owned import admin, copying
from .results import scalar
from .scatter import chunks, sql_bytes
from .topology import Topology

__all__ = [
    "Side",
    "Syncer",
    "Table",
    "copy_wide",
    "create_missing",
    "discovered",
    "shard_tables",
    "table_names",
]


@dataclass(frozen=True)
class Table:
    """How to compare and copy one table of a shard."""

    name: str
    key: tuple[str, ...]  # its unique key (owned entities: `by_shard_added`), `shard` first
    columns: tuple[str, ...]  # every column, in order
    light: tuple[str, ...]  # SQL expressions compared row by row (a digest of big columns)
    hint: str = ""  # the index that reads the shard's rows in key order

    @property
    def heavy(self) -> bool:
        """Compared by digest: differing rows are fetched in full before copying."""
        return self.light != tuple(quote(c) for c in self.columns)

    def sharded(self, hint: str = "PRIMARY") -> Table:
        """The owned layout's table: ``shard`` first in key, columns and comparison,
        read by the index ``hint`` (whose order is the key's: ``shard`` first)."""
        return Table(
            self.name,
            ("shard", *self.key),
            ("shard", *self.columns),
            ("`shard`", *self.light),
            f" FORCE INDEX ({quote(hint)})",
        )


_ENTITIES = Table(
    "entities",
    ("added_id",),
    ("added_id", "id", "version", "updated", "body"),
    ("`added_id`", "`id`", "`version`", "`updated`", "`body` IS NULL", "CRC32(`body`)"),
)
# The change feed's tables travel with their shard, numbers and all (nothing is emitted
# for the copy: it never writes through step 2).
_CHANGES = Table(
    "changes",
    ("seq",),
    ("seq", "id", "version", "body", "at"),
    ("`seq`", "`id`", "`version`", "`at`", "`body` IS NULL", "CRC32(`body`)"),
)
_CHANGES_HEAD = Table("changes_head", ("one",), ("one", "seq"), ("`one`", "`seq`"))
_OWNED_HEAD = Table("changes_head", ("shard",), ("shard", "seq"), ("`shard`", "`seq`"))


def _fence_table(name: str) -> Table:
    return Table(name, ("unused",), ("unused",), ("`unused`",))  # always empty


def _index_table(index: Index) -> Table:
    cols = (*index.columns, "entity_id", "entity_version")
    key = index.columns if index.unique else (*index.columns, "entity_id")  # its primary key
    return Table(index.table, key, cols, tuple(quote(c) for c in cols))


def shard_tables(topo: Topology) -> list[Table]:
    """The tables a move copies: entities, every index's, the feed's, and (a database
    per shard) the fence; the owned layout's fence is the server's, not the shard's."""
    indexes = [_index_table(info.index) for info in topo.indexes.values()]
    if topo.owned_db is not None:
        feed = [_CHANGES.sharded(), _OWNED_HEAD] if topo.changes else []
        return [
            _ENTITIES.sharded("by_shard_added"),
            *(t.sharded("by_shard") for t in indexes),
            *feed,
        ]
    fence = [_fence_table(topo.fence)] if topo.fence else []
    feed = [_CHANGES, _CHANGES_HEAD] if topo.changes else []
    return [_ENTITIES, *indexes, *feed, *fence]


def discovered(server: Server, db: str, known: set[str]) -> tuple[list[Table], list[str]]:
    """The owned layout's other tables in ``db`` (those a module makes on first use:
    ``schemaless.edges``, ``schemaless.feeds``): with a ``shard`` column, compared and
    copied by the shard's rows like the library's, by their primary key; without one,
    the server-wide tables (copied whole, ``copy_wide``).  ``owned``, its digest and
    fences never."""
    cols = server.run(
        "SELECT c.table_name, c.column_name, k.ordinal_position FROM information_schema.columns c"
        " LEFT JOIN information_schema.key_column_usage k ON k.table_schema = c.table_schema"
        " AND k.table_name = c.table_name AND k.column_name = c.column_name"
        " AND k.constraint_name = 'PRIMARY' WHERE c.table_schema = %s"
        " ORDER BY c.table_name, c.ordinal_position",
        (db,),
    )[0]
    found: dict[str, list[tuple[str, int | None]]] = {}
    for table, column, key in cols:
        if (
            str(table) not in known
            and str(table) not in ("owned", "owned_digest")
            and not str(table).startswith("fence_")
        ):
            found.setdefault(str(table), []).append((str(column), key))
    sharded, wide = [], []
    for name, columns in sorted(found.items()):
        names = tuple(c for c, _ in columns)
        if "shard" not in names:
            wide.append(name)
            continue
        key = tuple(c for c, k in sorted((x for x in columns if x[1]), key=lambda x: x[1] or 0))
        hint = " FORCE INDEX (PRIMARY)" if key[:1] == ("shard",) else ""
        sharded.append(Table(name, key, names, tuple(quote(c) for c in names), hint))
    return sharded, wide


def copy_wide(src: Server, dst: Server, db: str, tables: Sequence[str]) -> None:
    """Give the target each server-wide table of the source, and the source's rows
    (a list every server keeps whole, e.g. a feed's pulled authors: ``INSERT IGNORE``)."""
    present = table_names(dst, db)
    for name in tables:
        table = quote(db, name)
        if name not in present:
            dst.run(admin([_definition(src, db, name)]))
        rows = src.run(admin([f"SELECT * FROM {table}"]))[0]
        if rows:
            marks = ", ".join(["(" + ", ".join(["%s"] * len(rows[0])) + ")"] * len(rows))
            dst.run(
                admin([f"INSERT IGNORE INTO {table} VALUES {marks}"]), [v for r in rows for v in r]
            )


def create_missing(src: Server, dst: Server, db: str, tables: Sequence[Table]) -> None:
    """Create on the target the discovered shard tables it lacks, from the source's
    definitions, with the guard's triggers (and an edge table's count trigger, which
    skips the copy's rows)."""
    present = table_names(dst, db)
    for t in tables:
        if t.name not in present:
            made = _definition(src, db, t.name)
            dst.run(admin([made, *triggers_sql(db, t.name, made)]))


def _definition(server: Server, db: str, name: str) -> str:
    """A table's ``CREATE TABLE IF NOT EXISTS`` as the server has it (its own name in
    ``db``: ``SHOW CREATE TABLE`` leaves the database out)."""
    made = str(server.run(admin([f"SHOW CREATE TABLE {quote(db, name)}"]))[0][0][1])
    return made.replace(
        f"CREATE TABLE {quote(name)}", f"CREATE TABLE IF NOT EXISTS {quote(db, name)}", 1
    )


def table_names(server: Server, db: str) -> set[str]:
    """The tables of a database."""
    rows = server.run(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (db,)
    )[0]
    return {str(r[0]) for r in rows}


@dataclass(frozen=True)
class Side:
    """One server's copy of a logical shard: ``db``'s tables, or (owned layout,
    ``shard`` given) their rows of that shard."""

    server: Server
    db: str
    shard: int | None = None

    @property
    def where(self) -> str:
        """The condition (with ``AND``) that picks the shard's rows."""
        return "" if self.shard is None else f"`shard` = {int(self.shard)} AND "

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one administrative ``SELECT``."""
        return list(self.server.run(admin([sql]), params)[0])

    def write(self, stmt: str, params: Sequence[Any] = ()) -> None:
        """A statement that writes the shard's rows here, before this server owns it."""
        if self.shard is None:
            self.server.run(admin([stmt]), params)
            return
        self.server.run(admin(copying(self.shard, [stmt])), params)


class Syncer:
    """Copies and compares a shard's tables between two sides, ``chunk`` rows at a
    time, statements below ``max_bytes``."""

    def __init__(self, chunk: int, max_bytes: int):
        self.chunk = chunk
        self.max_bytes = max_bytes

    def present(self, side: Side) -> set[str]:
        """The tables of a copy to read from, which has its entities at least."""
        present = table_names(side.server, side.db)
        if "entities" not in present:
            raise CatalogError(f"{side.db} on {side.server.name} has no entities table")
        return present

    def sync_all(self, src: Side, dst: Side, tables: Sequence[Table]) -> tuple[int, int]:
        """Make every table of ``dst`` equal to ``src``'s: (rows copied, rows deleted)."""
        present = self.present(src)
        copied = deleted = 0
        for table in tables:
            if table.name in present:
                c, d = self.sync(src, dst, table)
                copied += c
                deleted += d
        return copied, deleted

    def sync(self, src: Side, dst: Side, table: Table) -> tuple[int, int]:
        """Make the target table equal to the source table, chunk by chunk."""
        keys = [quote(c) for c in table.key]
        order = ", ".join(keys)
        light = ", ".join(table.light)
        n_key = len(table.key)
        last: tuple[Any, ...] | None = None
        copied = deleted = 0
        while True:
            after, params = _after(keys, last)
            src_rows = src.read(
                f"SELECT {light} FROM {quote(src.db, table.name)}{table.hint}"
                f" WHERE {src.where}{after}"
                f" ORDER BY {order} LIMIT {int(self.chunk)}",
                params,
            )
            upto, upto_params = "TRUE", list[Any]()  # the last chunk: every later target row too
            if len(src_rows) == self.chunk:
                upto, upto_params = _upto(keys, tuple(src_rows[-1][:n_key]))
            dst_rows = dst.read(
                f"SELECT {light} FROM {quote(dst.db, table.name)}{table.hint}"
                f" WHERE {dst.where}{after} AND {upto}",
                [*params, *upto_params],
            )
            theirs = {tuple(r[:n_key]): tuple(r) for r in dst_rows}
            need = [tuple(r) for r in src_rows if theirs.pop(tuple(r[:n_key]), None) != tuple(r)]
            if need:
                copied += self._copy(src, dst, table, need)
            if theirs:
                deleted += len(theirs)
                where = " AND ".join(f"{k} = %s" for k in keys)
                dst.server.run(
                    admin([f"DELETE FROM {quote(dst.db, table.name)} WHERE {where}"] * len(theirs)),
                    [v for key in theirs for v in key],
                )
            if len(src_rows) < self.chunk:
                return copied, deleted
            last = tuple(src_rows[-1][:n_key])

    def _copy(self, src: Side, dst: Side, table: Table, rows: list[tuple[Any, ...]]) -> int:
        if table.heavy:  # fetch the full rows (bodies) by primary key (its last column)
            ids = [r[len(table.key) - 1] for r in rows]
            rows = [
                tuple(r)
                for r in src.read(
                    f"SELECT {', '.join(quote(c) for c in table.columns)}"
                    f" FROM {quote(src.db, table.name)} WHERE {src.where}"
                    f"{quote(table.key[-1])} IN ({', '.join(['%s'] * len(ids))})",
                    ids,
                )
            ]
        one = "(" + ", ".join(["%s"] * len(table.columns)) + ")"
        for part in chunks(rows, sql_bytes, self.max_bytes):
            dst.write(
                f"REPLACE INTO {quote(dst.db, table.name)}"
                f" ({', '.join(quote(c) for c in table.columns)}) VALUES "
                + ", ".join([one] * len(part)),
                [v for r in part for v in r],
            )
        return len(rows)

    def verify(self, src: Side, dst: Side, tables: Sequence[Table]) -> dict[str, tuple[int, int]]:
        """Row counts and digests must agree on both sides (read in parallel):
        ``CHECKSUM TABLE`` of a database per shard; the ``BIT_XOR`` of each row's
        ``CRC32`` in the owned layout (a table holds every shard of its server)."""
        present = self.present(src)
        names = [t for t in tables if t.name in present]
        sides = {"source": src, "target": dst}
        got = gather(
            {
                k: Batch(side.server, admin([q for t in names for q in _digest_sql(side, t)]))
                for k, side in sides.items()
            }
        )
        sums = {k: _digests(side, got[k]) for k, side in sides.items()}
        for table, ours, theirs in zip(names, sums["source"], sums["target"], strict=True):
            if ours != theirs:
                raise CatalogError(
                    f"verification failed for {table.name}: source {ours} != target {theirs}"
                )
        return {t.name: n for t, n in zip(names, sums["source"], strict=True)}

    def delete(self, side: Side, tables: Sequence[Table], pause: float) -> int:
        """Delete a side's rows of its shard (owned layout: ``side.shard`` given),
        ``chunk`` rows a statement,
        ``pause`` seconds between statements; never where the server owns the shard."""
        shard = int(side.shard or 0)
        present = table_names(side.server, side.db)
        unowned = f"NOT EXISTS (SELECT 1 FROM {quote(side.db, 'owned')} WHERE `shard` = {shard})"
        total = 0
        for table in tables:
            if table.name not in present:
                continue
            stmt = (
                f"DELETE FROM {quote(side.db, table.name)} WHERE `shard` = {shard} AND {unowned}"
                f" ORDER BY {', '.join(quote(k) for k in table.key)} LIMIT {int(self.chunk)}"
            )
            while True:
                counts: list[int] = []
                side.server.run(admin([stmt]), counts=counts)
                total += counts[0]
                if counts[0] < self.chunk:
                    break
                time.sleep(pause)
        return total


def _digest_sql(side: Side, table: Table) -> list[str]:
    t = quote(side.db, table.name)
    if side.shard is None:
        return [f"SELECT COUNT(*) FROM {t}", f"CHECKSUM TABLE {t}"]
    row = f"CONCAT_WS('|', {', '.join(table.light)})"
    return [f"SELECT COUNT(*), COALESCE(BIT_XOR(CRC32({row})), 0) FROM {t} WHERE {side.where}TRUE"]


def _digests(side: Side, results: Sequence[Any]) -> list[tuple[int, int]]:
    """(rows, digest) of each table from the results of its ``_digest_sql``."""
    if side.shard is None:
        pairs = zip(results[0::2], results[1::2], strict=True)
        return [(int(scalar(n)), int(c[0][1] or 0)) for n, c in pairs]
    return [(int(r[0][0]), int(r[0][1])) for r in results]


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
