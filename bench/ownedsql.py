"""The ``d_owned`` layout's statements (issue 39, steps 1 and 2): pure builders.

One database per server holds ``entities`` (``shard`` a column), one table per index
(``shard`` a column) and ``owned``, a row per logical shard the server holds.  Every
read batch ends with a count of the ``owned`` rows of the shards it read
(``read_batch``: a count below the shards named is a stale map); every statement that
writes names the shard's ``owned`` row and takes its shared lock, so a move's fence
(``fence_sql``, the row's ``DELETE``) waits for that shard's open writers only, and a
write after it changes nothing (0 rows):

* an insert is ``INSERT ... SELECT ... FROM owned WHERE shard = s LOCK IN SHARE MODE``
  (at READ COMMITTED, the library's isolation, an ``INSERT ... SELECT`` reads its
  source without a lock: without the clause the fence would not wait for it);
* an update is ``UPDATE t JOIN owned ...``, a delete ``DELETE t FROM t JOIN owned ...``
  (a multi-table statement takes a shared lock on the rows it only reads).

A write batch's plain reads (the old body, before a write) need no count: the write
after them is guarded, and only the result of a write that applied is used.  The
builders mirror ``schemaless.writes`` (step 1 upserts, step 2's entity batch, step 3's
guarded deletes), parameters in the same order.

``OwnedDb.guard`` picks the guard's shape: ``row`` (the above, every statement), or
``head``: plain statements after one check at the batch's head, in its transaction
(``head_sql``: the batch's shards' rows counted under a shared lock, a ``SIGNAL`` if
one is missing, which ends the batch with error 1644 and writes nothing, as today's
missing table does); ``trigger``: plain statements, the check in the tables' triggers
(``OwnedDb.triggers``: in the server, whatever statement writes); ``none`` is no guard
at all (``b_key``'s writes: no fence, only the benchmark's measure of what the tables
alone cost).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from schemaless.index import Index
from schemaless.names import quote
from schemaless.schema import fence_epoch, fence_table_sql
from schemaless.writes import EntityWrite, IndexRow

__all__ = [
    "OwnedDb",
    "count_sql",
    "delete_rows_sql",
    "entity_batch_sql",
    "entity_sql",
    "fence_sql",
    "head_sql",
    "read_batch",
    "stale_shards",
    "upsert_rows_sql",
    "upsert_sql",
]


@dataclass(frozen=True)
class OwnedDb:
    """A server's database of the owned layout (its tables' quoted names) and the
    shape of its writes' guard (``row``, ``head``, ``trigger`` or ``none``)."""

    name: str
    guard: str = "row"

    def table(self, table: str) -> str:
        return quote(self.name, table)

    @property
    def owned(self) -> str:
        return self.table("owned")

    @property
    def entities(self) -> str:
        return self.table("entities")

    def ddl(
        self, indexes: Sequence[Index], shards: Iterable[int], fence: str | None = None
    ) -> list[str]:
        """The database, its tables (rows: the ``owned`` ones of ``shards``) and the
        index epoch's ``fence`` table (once per server)."""
        out = [
            f"CREATE DATABASE IF NOT EXISTS {quote(self.name)}",
            f"CREATE TABLE IF NOT EXISTS {self.entities} (`shard` SMALLINT UNSIGNED NOT NULL,"
            " `added_id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, `id` BINARY(16) NOT NULL,"
            " `version` BIGINT UNSIGNED NOT NULL, `updated` BIGINT UNSIGNED NOT NULL,"
            " `body` MEDIUMBLOB NULL, PRIMARY KEY (`shard`, `added_id`),"
            " KEY `added` (`added_id`), UNIQUE KEY `by_id` (`id`),"
            " KEY `by_updated` (`updated`)) ENGINE=InnoDB",
            f"CREATE TABLE IF NOT EXISTS {self.owned}"
            " (`shard` SMALLINT UNSIGNED NOT NULL PRIMARY KEY) ENGINE=InnoDB",
        ]
        for index in indexes:
            cols = ", ".join(
                f"{quote(c)} {t.sql} NOT NULL"
                for c, t in zip(index.columns, index.types, strict=True)
            )
            key = ", ".join(quote(c) for c in index.columns)
            pk = key if index.unique else f"{key}, `entity_id`"
            out.append(
                f"CREATE TABLE IF NOT EXISTS {self.table(index.table)}"
                f" (`shard` SMALLINT UNSIGNED NOT NULL, {cols}, `entity_id` BINARY(16) NOT NULL,"
                f" `entity_version` BIGINT UNSIGNED NOT NULL, PRIMARY KEY ({pk}),"
                " KEY `by_entity` (`entity_id`), KEY `by_shard` (`shard`)) ENGINE=InnoDB"
                " DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin"
            )
        if fence is not None:
            out.append(fence_table_sql(self.name, fence_epoch(fence) or 0))
        if self.guard == "trigger":
            for table in ["entities", *(index.table for index in indexes)]:
                out += self.triggers(table)
        rows = ", ".join(f"({int(s)})" for s in shards)
        if rows:
            out.append(f"INSERT IGNORE INTO {self.owned} VALUES {rows}")
        return out

    def triggers(self, table: str) -> list[str]:
        """The ``trigger`` guard of one table: an insert or update of a row whose shard
        has no ``owned`` row fails (1644); the row's shared lock is held to the commit.
        (Deletes are left unguarded: a stale one removes rows the move deletes anyway,
        and the move's own deletes of the old rows come after the fence.)"""
        return [
            f"CREATE TRIGGER IF NOT EXISTS {quote(self.name, f'{table}_{when[:3].lower()}')}"
            f" BEFORE {when} ON {self.table(table)} FOR EACH ROW IF NOT EXISTS (SELECT 1 FROM"
            f" {self.owned} WHERE `shard` = NEW.`shard` LOCK IN SHARE MODE) THEN SIGNAL"
            " SQLSTATE '45000' SET MESSAGE_TEXT = 'this logical shard is not on this server';"
            " END IF"
            for when in ("INSERT", "UPDATE")
        ]


# -- reads ------------------------------------------------------------------------------


def count_sql(db: OwnedDb, shards: Iterable[int]) -> str:
    """How many of ``shards`` the server owns (the last statement of every read batch)."""
    return f"SELECT COUNT(*) FROM {db.owned} WHERE `shard` IN ({_ints(sorted(set(shards)))})"


def read_batch(db: OwnedDb, stmts: Sequence[str], shards: Iterable[int]) -> str:
    """A read batch: its statements, then the count of the shards they read (after the
    rows, so a fence that commits in between is seen by the count)."""
    return ";\n".join([*stmts, count_sql(db, shards)])


def stale_shards(sets: Sequence[Sequence[tuple[Any, ...]]], shards: Iterable[int]) -> bool:
    """Whether a read batch's result sets (the count last) show a shard not owned."""
    return int(sets[-1][0][0]) != len(set(shards))


def fence_sql(db: OwnedDb, shard: int) -> str:
    """A move's fence: the shard's ``owned`` row deleted (waits for its open writers)."""
    return f"DELETE FROM {db.owned} WHERE `shard` = {int(shard)}"


# -- writes -----------------------------------------------------------------------------


def _guard(db: OwnedDb, shard: int, rows: str = "") -> str:
    """The source of every guarded insert: the shard's row under a shared lock (after
    ``rows``, a derived table of the rows to insert, if any)."""
    return f" FROM {rows}{db.owned} WHERE {db.owned}.`shard` = {int(shard)} LOCK IN SHARE MODE"


def _join(db: OwnedDb, table: str, shard: int) -> str:
    """``<table> JOIN owned`` on the shard's row (a multi-table write: shared lock)."""
    return (
        f"{table} JOIN {db.owned} ON {db.owned}.`shard` = {table}.`shard`"
        f" AND {db.owned}.`shard` = {int(shard)}"
    )


_UPSERT_TAIL = (
    " ON DUPLICATE KEY UPDATE"
    " `entity_version` = GREATEST(`entity_version`, VALUES(`entity_version`))"
)
_UNIQUE_TAIL = (
    " ON DUPLICATE KEY UPDATE `entity_version` = IF(`entity_id` = VALUES(`entity_id`),"
    " GREATEST(`entity_version`, VALUES(`entity_version`)), `entity_version`)"
)


@functools.lru_cache(maxsize=4096)
def upsert_sql(db: OwnedDb, index: Index, shard: int, rows: int) -> str:
    """A guarded upsert of ``rows`` rows of one index on one shard (parameters per row:
    its values, ``entity_id``, ``entity_version``); a unique index's claim keeps a row
    of another owner as it is (as today's).  One row is selected with the ``owned``
    row; several come from a derived table, whose first row types the binary columns
    (a plain literal there would make a utf8mb4 column and lose bytes)."""
    cols = ", ".join(quote(c) for c in (*index.columns, "entity_id", "entity_version"))
    binary = [t.sql.startswith(("BINARY", "VARBINARY")) for t in index.types] + [True, False]
    tail = _UNIQUE_TAIL if index.unique else _UPSERT_TAIL
    head = f"INSERT INTO {db.table(index.table)} (`shard`, {cols})"
    if db.guard != "row":
        one = f"({int(shard)}, {', '.join(['%s'] * len(binary))})"
        return f"{head} VALUES {', '.join([one] * rows)}{tail}"
    if rows == 1:
        values = ", ".join(["%s"] * len(binary))
        return f"{head} SELECT {db.owned}.`shard`, {values}{_guard(db, shard)}{tail}"
    first = ", ".join(f"{'_binary ' if b else ''}%s AS `c{i}`" for i, b in enumerate(binary))
    more = f" UNION ALL SELECT {', '.join(['%s'] * len(binary))}" * (rows - 1)
    derived = f"(SELECT {first}{more}) AS `v`, "
    return f"{head} SELECT {db.owned}.`shard`, `v`.*{_guard(db, shard, derived)}{tail}"


def _upserts(db: OwnedDb, rows: Iterable[IndexRow]) -> tuple[list[str], list[Any]]:
    groups: dict[tuple[int, str], list[IndexRow]] = {}
    for row in rows:
        groups.setdefault((row.shard, row.index.name), []).append(row)
    stmts: list[str] = []
    params: list[Any] = []
    for (shard, _), group in sorted(groups.items()):
        group.sort(key=lambda r: (r.values, r.entity_id))
        stmts.append(upsert_sql(db, group[0].index, shard, len(group)))
        for row in group:
            params += [*row.values, row.entity_id, row.version]
    return stmts, params


def upsert_rows_sql(db: OwnedDb, rows: Iterable[IndexRow]) -> tuple[str, list[Any]]:
    """Step 1: one guarded multi-row upsert per (logical shard, index)."""
    rows = list(rows)
    stmts, params = _upserts(db, rows)
    return _batch(db, stmts, [r.shard for r in rows]), params


def delete_rows_sql(db: OwnedDb, rows: Iterable[IndexRow]) -> tuple[str, list[Any]]:
    """Step 3: delete an old body's rows where ``entity_version < V``, guarded."""
    stmts: list[str] = []
    params: list[Any] = []
    rows = sorted(rows, key=lambda r: (r.shard, r.index.name, r.values, r.entity_id))
    for row in rows:
        table = db.table(row.index.table)
        where = " AND ".join(f"{table}.{quote(c)} = %s" for c in row.index.columns)
        target = f"{table} FROM {_join(db, table, row.shard)}"
        if db.guard != "row":
            target = f"FROM {table}"
            where += f" AND {table}.`shard` = {int(row.shard)}"
        stmts.append(
            f"DELETE {target} WHERE {where}"
            f" AND {table}.`entity_id` = %s AND {table}.`entity_version` < %s"
        )
        params += [*row.values, row.entity_id, row.version]
    return _batch(db, stmts, [r.shard for r in rows]), params


def entity_batch_sql(
    db: OwnedDb,
    writes: Sequence[EntityWrite],
    rows: Sequence[IndexRow] = (),
    fence: str | None = None,
) -> tuple[str, list[Any], int]:
    """Step 2 as ``schemaless.writes.entity_batch_sql`` sends it (same parameters, same
    result sets, the first write's position among the statements without a result
    set), each write guarded by its shard's ``owned`` row.  ``fence``: the index
    epoch's fence table, once per server here (named by the batch's first body)."""
    stmts, params = _upserts(db, rows)
    upserts = len(stmts)
    fenced = False
    for w in sorted(writes, key=lambda w: (w.shard, w.entity_id)):
        kind = w.mode.kind if w.body is not None else "delete"
        if w.body is None and w.mode.kind != "blind":
            kind = "delete_cas"
        use_fence = fence if fence is not None and w.body is not None and not fenced else None
        fenced = fenced or use_fence is not None
        stmts.append(entity_sql(db, w.shard, kind, w.want_body, use_fence))
        if w.want_body:
            params.append(w.entity_id)
        if kind in ("blind", "create", "new"):
            params += [w.entity_id, w.version, w.updated, w.body]
        elif kind == "cas":
            params += [w.body, w.updated, w.version, w.entity_id, w.mode.expected]
        elif kind == "delete":
            params += [w.updated, w.version, w.entity_id, w.version]
        else:
            params += [w.updated, w.version, w.entity_id, w.mode.expected]
    shards = [r.shard for r in rows] + [w.shard for w in writes]
    sql = _batch(db, stmts, shards)
    if not sql.startswith("START TRANSACTION"):
        return sql, params, 0
    return sql, params, upserts + (2 if db.guard == "head" else 1)


@functools.lru_cache(maxsize=4096)
def entity_sql(db: OwnedDb, shard: int, kind: str, want_body: bool, fence: str | None) -> str:
    """One entity's step 2 (today's conditions, each write guarded by the row)."""
    ent = db.entities
    version = f"%s + (SELECT COUNT(*) FROM {db.table(fence)})" if fence else "%s"
    stmts = [f"SELECT `body` FROM {ent} WHERE `id` = %s"] if want_body else []
    cols = f"INSERT INTO {ent} (`shard`, `id`, `version`, `updated`, `body`)"
    insert = f"{cols} SELECT {db.owned}.`shard`, %s, {version}, %s, %s{_guard(db, shard)}"
    target = _join(db, ent, shard)
    if db.guard != "row":
        insert = f"{cols} VALUES ({int(shard)}, %s, {version}, %s, %s)"
        target = ent
    if kind == "new":
        stmts.append(insert)
    elif kind in ("blind", "create"):
        cond = "`version` < VALUES(`version`)"
        if kind == "create":
            cond = "`body` IS NULL AND " + cond
        stmts.append(
            f"{insert} ON DUPLICATE KEY UPDATE `updated` = IF(@ok := ({cond}), VALUES(`updated`),"
            " `updated`), `body` = IF(@ok, VALUES(`body`), `body`),"
            " `version` = IF(@ok, VALUES(`version`), `version`)"
        )
    elif kind == "cas":
        stmts.append(
            f"UPDATE {target} SET `body` = %s, `updated` = %s, `version` = {version}"
            f" WHERE {ent}.`id` = %s AND `version` = %s AND `body` IS NOT NULL"
        )
    else:
        guard = "`version` < %s" if kind == "delete" else "`version` = %s"
        stmts.append(
            f"UPDATE {target} SET `body` = NULL, `updated` = %s, `version` = %s"
            f" WHERE {ent}.`id` = %s AND `body` IS NOT NULL AND {guard}"
        )
    return ";\n".join(stmts)


def head_sql(db: OwnedDb, shards: Iterable[int]) -> str:
    """The ``head`` guard: the rows of the batch's shards, under a shared lock, or an
    error (1644) that ends the batch before anything is written."""
    named = sorted(set(shards))
    return (
        f"BEGIN NOT ATOMIC IF (SELECT COUNT(*) FROM {db.owned} WHERE `shard` IN ({_ints(named)})"
        f" LOCK IN SHARE MODE) < {len(named)} THEN SIGNAL SQLSTATE '45000'"
        " SET MESSAGE_TEXT = 'a logical shard of this batch is not on this server'; END IF; END"
    )


def _batch(db: OwnedDb, stmts: list[str], shards: Iterable[int]) -> str:
    """Several statements share one commit; with the ``head`` guard, after its check."""
    if db.guard == "head":
        stmts = ["START TRANSACTION", head_sql(db, shards), *stmts, "COMMIT"]
    elif len(stmts) > 1:
        stmts = ["START TRANSACTION", *stmts, "COMMIT"]
    return ";\n".join(stmts)


def _ints(values: Iterable[int]) -> str:
    return ", ".join(str(int(v)) for v in values)
