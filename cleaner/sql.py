"""SQL of the Cleaner (pure builders: statements and parameters, nothing sent).

Every delete carries the Cleaner's guard ``entity_version <= <version seen>``; a
fence writes a tombstone above the versions of an absent entity's orphan rows.

``dbs`` are the logical shards' databases (``Topology.dbs``) and ``owned`` the owned
layout's data database (``Topology.owned_db``, None in the layout of a database per
shard): then a read by anything but a primary key or an entity id names its shards,
every row written carries its shard, and every batch ends with the ownership check
(``owned.guarded``; a write's before its ``COMMIT``, ``owned.in_guarded_transaction``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any

from schemaless.index import Index
from schemaless.names import quote
from schemaless.owned import checked_first, guarded, in_guarded_transaction, locked
from schemaless.tables import union_all
from schemaless.writes import later_sql, owners_sql, upsert_sql, upsert_text_sql

from .native import rows as _rows

__all__ = [
    "Guarded",
    "added_ranges_sql",
    "backlog_sql",
    "bump_sql",
    "delete_guarded_sql",
    "entity_versions_sql",
    "fence_sql",
    "index_upserts_sql",
    "purge_sql",
    "recent_batch_sql",
    "rows_by_entity_sql",
    "rows_by_key_sql",
    "rows_text",
    "versions_proof_sql",
]

#: One index row to delete: (index, logical shard, values, entity_id, guard version).
Guarded = tuple[Index, int, tuple[Any, ...], bytes, int]


def _is(owned: str | None, shard: int) -> str:
    """The owned layout's condition on one shard's rows, with ``AND``."""
    return f"`shard` = {int(shard)} AND " if owned is not None else ""


def rows_by_entity_sql(
    dbs: Sequence[str],
    owned: str | None,
    shards: Sequence[int],
    indexes: Sequence[Index],
    ids: Sequence[bytes],
) -> tuple[str, list[Any]]:
    """The rows of some entities in every index table of some shards (``KEY(entity_id)``).

    One statement per index (``UNION ALL`` over the shards; owned layout: ``shard IN``
    the shards, then the check), in index order; each row is ``(shard, values...,
    entity_id, entity_version)``.
    """
    marks = ", ".join(["%s"] * len(ids))
    stmts: list[str] = []
    params: list[Any] = []
    for index in indexes:
        cols = ", ".join(quote(c) for c in index.columns)
        if owned is not None:
            stmts.append(
                f"SELECT `shard`, {cols}, `entity_id`, `entity_version`"
                f" FROM {quote(owned, index.table)} WHERE `entity_id` IN ({marks})"
                f" AND `shard` IN ({', '.join(str(int(s)) for s in shards)})"
            )
            params.extend(ids)
            continue
        parts = []
        for shard in shards:
            parts.append(
                f"SELECT {int(shard)}, {cols}, `entity_id`, `entity_version`"
                f" FROM {quote(dbs[shard], index.table)} WHERE `entity_id` IN ({marks})"
            )
            params.extend(ids)
        stmts.append(union_all(parts))
    return guarded(stmts, owned, shards), params


def rows_by_key_sql(
    dbs: Sequence[str],
    owned: str | None,
    index: Index,
    shard: int,
    rows: Sequence[tuple[Any, ...]],
) -> tuple[str, list[Any]]:
    """Index rows ``(values..., entity_id, ...)`` of one logical shard by primary key
    (values and entity id, which also pins a unique index's row to its owner): rows
    ``(shard, values..., entity_id, entity_version)``.  (A primary key is unique on a
    server and places its row: no shard condition.)"""
    cols = [quote(c) for c in index.columns]
    one = "(" + " AND ".join(f"{c} = %s" for c in [*cols, "`entity_id`"]) + ")"
    n = len(cols) + 1
    select = (
        f"SELECT {int(shard)}, {', '.join(cols)}, `entity_id`, `entity_version`"
        f" FROM {quote(dbs[shard], index.table)} WHERE {' OR '.join([one] * len(rows))}"
    )
    return guarded([select], owned, [shard]), list(chain.from_iterable(row[:n] for row in rows))


def delete_guarded_sql(
    dbs: Sequence[str], owned: str | None, rows: Iterable[Guarded]
) -> tuple[str, list[Any]]:
    """Delete index rows only where ``entity_version <= guard``, in one transaction;
    one result set: the number of rows deleted."""
    stmts = ["SET @cleaned = 0"]
    params: list[Any] = []
    shards: set[int] = set()
    for index, shard, values, entity_id, guard in sorted(
        rows, key=lambda r: (r[1], r[0].name, r[3])
    ):
        where = " AND ".join(f"{quote(c)} = %s" for c in index.columns)
        stmts.append(
            f"DELETE FROM {quote(dbs[shard], index.table)} WHERE {where}"
            " AND `entity_id` = %s AND `entity_version` <= %s"
        )
        stmts.append("SET @cleaned = @cleaned + ROW_COUNT()")
        params.extend(values)
        params.append(entity_id)
        params.append(guard)
        shards.add(shard)
    return in_guarded_transaction(stmts, owned, shards) + ";\nSELECT @cleaned", params


def fence_sql(
    dbs: Sequence[str], owned: str | None, fences: Iterable[tuple[int, bytes, int]], now: int
) -> tuple[str, list[Any]]:
    """Write a tombstone of at least ``version`` for entities that are absent or dead.

    ``fences``: ``(shard, id, version)``.  An absent id gets a new tombstone; a
    tombstone is raised to ``version``; a live entity is left alone.  One result set
    per fence: ``(version, is_tombstone)`` as stored afterwards.  One transaction.

    Two statements, not an ``INSERT ... ON DUPLICATE KEY UPDATE``: that needs the
    UPDATE privilege on every inserted column (``id`` too), and the Cleaner's grant
    allows only ``INSERT ([shard,] id, version, updated)`` and ``UPDATE (version,
    updated)`` on ``entities`` (schemaless.grants).  Each statement only raises a
    tombstone and never touches a live row; the read-back decides, as before.  In the
    owned layout the batch first holds the shards' ``owned`` rows (``checked_first``),
    so the ``IGNORE`` can only pass over a row present, never the guard key's refusal.
    """
    stmts: list[str] = []
    params: list[Any] = []
    fences = sorted(fences)
    for shard, entity_id, version in fences:
        table = quote(dbs[shard], "entities")
        if owned is not None:
            stmts.append(
                f"INSERT IGNORE INTO {table} (`shard`, `id`, `version`, `updated`)"
                " VALUES (%s, %s, %s, %s)"
            )
            params.append(shard)
        else:
            stmts.append(
                f"INSERT IGNORE INTO {table} (`id`, `version`, `updated`) VALUES (%s, %s, %s)"
            )
        params += [entity_id, version, now]
        stmts.append(
            f"UPDATE {table} SET `updated` = {later_sql('%s')}, `version` = %s"
            " WHERE `id` = %s AND `body` IS NULL AND `version` < %s"
        )
        params += [now, version, entity_id, version]
        stmts.append(f"SELECT `version`, `body` IS NULL FROM {table} WHERE `id` = %s")
        params.append(entity_id)
    return checked_first(stmts, owned, (f[0] for f in fences)), params


def bump_sql(
    dbs: Sequence[str], owned: str | None, shard: int, entity_id: bytes, seen: int, version: int
) -> tuple[str, list[Any]]:
    """Raise a live entity's version from ``seen`` to ``version`` (body unchanged), only
    if it is still at ``seen``, moving ``updated`` as every write of an entity row does
    (the owned layout's guard key is checked on its index); one result set: the rows
    changed (0 or 1)."""
    update = (
        f"UPDATE {quote(dbs[shard], 'entities')} SET `version` = %s, `updated` = `updated` + 1"
        " WHERE `id` = %s AND `version` = %s AND `body` IS NOT NULL"
    )
    return (
        in_guarded_transaction([update, "SELECT ROW_COUNT()"], owned, [shard]),
        [version, entity_id, seen],
    )


def entity_versions_sql(
    dbs: Sequence[str], owned: str | None, shard: int, after: int, last: int
) -> tuple[str, list[Any]]:
    """``(id, version)`` of the entity rows with ``after < added_id <= last``."""
    select = (
        f"SELECT `id`, `version` FROM {quote(dbs[shard], 'entities')}"
        f" WHERE {_is(owned, shard)}`added_id` > %s AND `added_id` <= %s"
    )
    return guarded([select], owned, [shard]), [after, last]


def versions_proof_sql(
    dbs: Sequence[str], owned: str | None, shard: int, runs: Sequence[tuple[int, int]]
) -> tuple[str, list[Any]]:
    """``(COUNT(*), SUM(version))`` of the entity rows whose ``added_id`` lies in one
    of the ``(first, last)`` runs: one row, read through the primary key."""
    ranges = " OR ".join(["`added_id` BETWEEN %s AND %s"] * len(runs))
    select = (
        f"SELECT COUNT(*), COALESCE(SUM(`version`), 0) FROM {quote(dbs[shard], 'entities')}"
        f" WHERE {_is(owned, shard)}({ranges})"
    )
    return guarded([select], owned, [shard]), list(chain.from_iterable(runs))


def index_upserts_sql(
    dbs: Sequence[str],
    owned: str | None,
    index: Index,
    groups: Sequence[tuple[int, Sequence[tuple[Any, ...]]]],
) -> tuple[str, list[Any]]:
    """Upsert rows ``(values..., entity_id, version)`` of one index, grouped by logical
    shard (``(shard, rows)``, each group sorted), with the write protocol's
    ``GREATEST`` guard: one multi-row statement per table, one transaction (owned
    layout: rows with their shard, in a ``locked`` batch: the triggers skip their
    lookup).  For a unique
    index, then one result set per group: the owners of its values (read in the
    transaction, before the check).

    Rows of integer and byte columns are rendered here (``rows_text``), a group at a
    time; the others are parameters."""
    shard = owned is not None
    shards = [s for s, _ in groups]
    render = rows_text(index)
    if render is not None:
        stmts = [
            upsert_text_sql(dbs[s], index, render(rows, s if shard else None), shard)
            for s, rows in groups
        ]
        return locked(stmts, owned, shards), []
    stmts = [upsert_sql(dbs[s], index, len(rows), shard) for s, rows in groups]
    if shard:  # each row's parameters begin with its shard
        each = (chain.from_iterable((s, *row) for row in rows) for s, rows in groups)
    else:
        each = (chain.from_iterable(rows) for _, rows in groups)
    params = list(chain.from_iterable(each))
    if index.unique:
        n = len(index.columns)
        for s, rows in groups:
            select, more = owners_sql(dbs[s], index, [row[:n] for row in rows])
            stmts.append(select)
            params += more
    return locked(stmts, owned, shards), params


#: Column types whose coerced values are ``int`` (rendered as digits) or ``bytes``
#: (rendered as a hex literal): neither needs the driver's escaping.
_DIGITS = frozenset({"int", "bool"})
_HEX = frozenset({"uuid", "auto"})


@lru_cache(maxsize=256)
def rows_text(index: Index) -> Callable[[Sequence[tuple[Any, ...]], int | None], str] | None:
    """The SQL text of coerced rows ``(values..., entity_id, version)`` of a non-unique
    index whose columns are all integers or bytes: ``(1,X'0a0b',7),(2,X'0c',7)``, or
    with a shard (the owned layout's rows begin with it) ``(3,1,X'0a0b',7),...``; None
    for other indexes (their values are parameters).  The values are the index's
    coerced ones (``int``, ``bytes``): ``%d`` and ``hex()`` raise on anything else, and
    neither output can hold a quote.  One ``%`` renders a whole group (a call per row
    cost 0.43 us a row, this 0.26); a group of one integer column, the common case, is
    rendered in C where the package has its C path (``_rows.int_text``)."""
    if index.unique:
        return None
    hexed: list[bool] = []
    for ctype in index.types:
        if ctype.name in _DIGITS:
            hexed.append(False)
        elif ctype.name in _HEX or ctype.name.startswith("bytes("):
            hexed.append(True)
        else:
            return None
    hexed += [True, False]  # entity_id, version
    fmt = ",".join("X'%s'" if h else "%d" for h in hexed) + "),"
    flags = tuple(hexed)

    def one(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(v.hex() if h else v for v, h in zip(row, flags, strict=True))

    def render(rows: Sequence[tuple[Any, ...]], shard: int | None = None) -> str:
        flat: list[Any] = []
        add = flat.extend
        if flags == (False, True, False):  # one integer column: the common case
            if _rows is not None:
                return _rows.int_text(rows if isinstance(rows, list) else list(rows), shard)
            for value, key, version in rows:
                add((value, key.hex(), version))
        else:
            for row in rows:
                add(one(row))
        head = "(" if shard is None else f"({int(shard)},"
        return ((head + fmt) * len(rows) % tuple(flat))[:-1]

    return render


def recent_batch_sql(
    dbs: Sequence[str], owned: str | None, shard: int, updated: int, added: int, limit: int
) -> tuple[str, list[Any]]:
    """Entity rows changed after ``(updated, added_id)``, oldest change first (uses
    ``KEY(updated)``, owned layout ``(shard, updated)``): ``(added_id, id, version,
    updated, body)``."""
    select = (
        f"SELECT `added_id`, `id`, `version`, `updated`, `body`"
        f" FROM {quote(dbs[shard], 'entities')} WHERE {_is(owned, shard)}`updated` >= %s"
        " AND (`updated` > %s OR `added_id` > %s)"
        f" ORDER BY `updated`, `added_id` LIMIT {int(limit)}"
    )
    return guarded([select], owned, [shard]), [updated, updated, added]


def backlog_sql(
    dbs: Sequence[str], owned: str | None, since: Mapping[int, int]
) -> tuple[str, list[Any]]:
    """How many entity rows changed after each shard's mark: one row, one count."""
    parts = []
    params: list[Any] = []
    for shard, mark in sorted(since.items()):
        parts.append(
            f"(SELECT COUNT(*) FROM {quote(dbs[shard], 'entities')}"
            f" WHERE {_is(owned, shard)}`updated` > %s)"
        )
        params.append(mark)
    return guarded(["SELECT " + " + ".join(parts)], owned, since), params


def added_ranges_sql(dbs: Sequence[str], owned: str | None, shards: Sequence[int]) -> str:
    """``(shard, MIN(added_id) - 1, MAX(added_id))`` of some shards (0, 0 if empty), one
    ``UNION ALL`` statement: each part two dives into the primary key (the owned
    layout's ``GROUP BY shard`` would scan the shards' rows instead)."""
    parts = [
        f"SELECT {int(s)}, COALESCE(MIN(`added_id`) - 1, 0), COALESCE(MAX(`added_id`), 0)"
        f" FROM {quote(dbs[s], 'entities')}"
        + (f" WHERE `shard` = {int(s)}" if owned is not None else "")
        for s in shards
    ]
    return guarded([union_all(parts)], owned, shards)


def purge_sql(
    dbs: Sequence[str], owned: str | None, shard: int, before: int, limit: int
) -> tuple[str, list[Any]]:
    """Delete up to ``limit`` tombstones last written before ``before`` (µs); one result
    set: the number deleted."""
    delete = (
        f"DELETE FROM {quote(dbs[shard], 'entities')}"
        f" WHERE {_is(owned, shard)}`updated` < %s AND `body` IS NULL"
        f" ORDER BY `updated` LIMIT {int(limit)}"
    )
    return in_guarded_transaction([delete, "SELECT ROW_COUNT()"], owned, [shard]), [before]
