"""SQL of the write protocol (docs/architecture.md, "The write protocol").

Pure builders: each returns statements and parameters for one server's batch.
Step 1 upserts index rows with ``GREATEST(entity_version, V)``; step 2 locks, writes
and reports one entity per three statements inside one transaction; step 3 deletes
the old body's rows only where ``entity_version < V``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .index import Index
from .names import quote

__all__ = [
    "BLIND",
    "CREATE",
    "EntityWrite",
    "IndexRow",
    "delete_rows_sql",
    "entity_batch_sql",
    "upsert_rows_sql",
]

BLIND = "blind"  # last writer wins; refused only if the stored version is already >= V
CREATE = "create"  # expect_version=0: the entity must be absent (or a tombstone)


@dataclass(frozen=True)
class IndexRow:
    """One index row of one entity, placed on a logical shard."""

    index: Index
    shard: int
    values: tuple[Any, ...]
    entity_id: bytes
    version: int


@dataclass(frozen=True)
class EntityWrite:
    """Step 2 for one entity: ``mode`` is BLIND, CREATE or the expected version."""

    db: str
    shard: int
    entity_id: bytes
    version: int
    updated: int
    body: bytes | None  # None: delete (write a tombstone)
    mode: str | int
    want_body: bool  # return the old body (needed when indexes are maintained)


def upsert_rows_sql(rows: Iterable[IndexRow], dbs: Sequence[str]) -> tuple[str, list[Any]]:
    """Step 1: one multi-row upsert per (logical shard, index) table."""
    groups: dict[tuple[int, str], list[IndexRow]] = {}
    for row in rows:
        groups.setdefault((row.shard, row.index.name), []).append(row)
    stmts: list[str] = []
    params: list[Any] = []
    for (shard, _), group in sorted(groups.items()):
        index = group[0].index
        group.sort(key=lambda r: (r.values, r.entity_id))
        cols = ", ".join(quote(c) for c in index.columns)
        one = "(" + ", ".join(["%s"] * (len(index.columns) + 2)) + ")"
        stmts.append(
            f"INSERT INTO {quote(dbs[shard], index.table)} ({cols}, `entity_id`,"
            f" `entity_version`) VALUES {', '.join([one] * len(group))}"
            " ON DUPLICATE KEY UPDATE"
            " `entity_version` = GREATEST(`entity_version`, VALUES(`entity_version`))"
        )
        for row in group:
            params.extend(row.values)
            params.append(row.entity_id)
            params.append(row.version)
    return ";\n".join(stmts), params


def delete_rows_sql(rows: Iterable[IndexRow], dbs: Sequence[str]) -> tuple[str, list[Any]]:
    """Step 3: delete rows of an old body, guarded by ``entity_version < V``."""
    stmts: list[str] = []
    params: list[Any] = []
    for row in sorted(rows, key=lambda r: (r.shard, r.index.name, r.values, r.entity_id)):
        where = " AND ".join(f"{quote(c)} = %s" for c in row.index.columns)
        stmts.append(
            f"DELETE FROM {quote(dbs[row.shard], row.index.table)} WHERE {where}"
            " AND `entity_id` = %s AND `entity_version` < %s"
        )
        params.extend(row.values)
        params.append(row.entity_id)
        params.append(row.version)
    return ";\n".join(stmts), params


def entity_batch_sql(writes: Sequence[EntityWrite]) -> tuple[str, list[Any]]:
    """Step 2: read, write and report each entity, in one round trip.

    Result sets per entity, in order: the row before, ``(version, is_tombstone[,
    body])`` (0 or 1 row; a plain read, only a hint of which rows step 3 removes), then
    the row after, ``(ROW_COUNT(), version, is_tombstone)`` (0 or 1 row).  Each write is
    one atomic conditional statement; several entities share one transaction (one
    commit), locked in id order so concurrent batches cannot deadlock.
    """
    stmts: list[str] = []
    params: list[Any] = []
    for w in sorted(writes, key=lambda w: (w.db, w.entity_id)):
        table = quote(w.db, "entities")
        old_cols = "`version`, `body` IS NULL" + (", `body`" if w.want_body else "")
        stmts.append(f"SELECT {old_cols} FROM {table} WHERE `id` = %s")
        params.append(w.entity_id)
        if w.body is None:
            sql, args = _tombstone(table, w)
        elif w.mode in (BLIND, CREATE):
            sql, args = _upsert(table, w)
        else:
            sql, args = _compare_and_set(table, w)
        stmts.append(sql)
        params.extend(args)
        stmts.append(f"SELECT ROW_COUNT(), `version`, `body` IS NULL FROM {table} WHERE `id` = %s")
        params.append(w.entity_id)
    if len(writes) > 1:
        stmts = ["START TRANSACTION", *stmts, "COMMIT"]
    return ";\n".join(stmts), params


def _upsert(table: str, w: EntityWrite) -> tuple[str, list[Any]]:
    if w.mode == BLIND:
        cond = "`version` < VALUES(`version`)"
    else:
        cond = "`body` IS NULL AND `version` < VALUES(`version`)"
    # The condition is evaluated once, before any column changes (assignments in
    # ON DUPLICATE KEY UPDATE see the values assigned to their left).
    sql = (
        f"INSERT INTO {table} (`id`, `version`, `updated`, `body`) VALUES (%s, %s, %s, %s)"
        f" ON DUPLICATE KEY UPDATE `updated` = IF(@ok := ({cond}), VALUES(`updated`), `updated`),"
        " `body` = IF(@ok, VALUES(`body`), `body`),"
        " `version` = IF(@ok, VALUES(`version`), `version`)"
    )
    return sql, [w.entity_id, w.version, w.updated, w.body]


def _compare_and_set(table: str, w: EntityWrite) -> tuple[str, list[Any]]:
    sql = (
        f"UPDATE {table} SET `body` = %s, `updated` = %s, `version` = %s"
        " WHERE `id` = %s AND `version` = %s AND `body` IS NOT NULL"
    )
    return sql, [w.body, w.updated, w.version, w.entity_id, w.mode]


def _tombstone(table: str, w: EntityWrite) -> tuple[str, list[Any]]:
    sql = (
        f"UPDATE {table} SET `body` = NULL, `updated` = %s,"
        " `version` = GREATEST(`version` + 1, %s)"
        " WHERE `id` = %s AND `body` IS NOT NULL"
    )
    args: list[Any] = [w.updated, w.version, w.entity_id]
    if isinstance(w.mode, int):
        sql += " AND `version` = %s"
        args.append(w.mode)
    return sql, args
