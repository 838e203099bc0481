"""SQL of the write protocol (docs/architecture.md, "The write protocol").

Pure builders: each returns statements and parameters for one server's batch.
Step 1 upserts index rows with ``GREATEST(entity_version, V)`` (a unique table's row
only if it names the same entity; a claim that meets another owner is settled with
``owners_sql``, ``takeover_sql`` and ``fence_owner_sql``); step 2 writes each
entity with one conditional statement (after the upserts of its rows that live on the
same server, in one transaction), the first body of each logical shard naming that
shard's fence table; step 3 deletes the old body's rows only where
``entity_version < V``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .counts import APPLIED, maintain_sql
from .index import Index
from .names import quote
from .owned import checked_first, in_transaction, locked, tentative, triggered

__all__ = [
    "BLIND",
    "CREATE",
    "LOCKED_ROWS",
    "NEW",
    "EntityWrite",
    "IndexRow",
    "PreparedWrite",
    "WriteMode",
    "delete_rows_sql",
    "entity_batch_sql",
    "feed_sql",
    "fence_owner_sql",
    "fires",
    "in_transaction",
    "later_sql",
    "owners_sql",
    "release_sql",
    "takeover_sql",
    "upsert_rows_sql",
    "upsert_sql",
    "upsert_text_sql",
    "upserts_sql",
    "write_position",
]


@dataclass(frozen=True, slots=True)
class WriteMode:
    """What a write of an entity expects of the stored one: ``BLIND`` (last writer
    wins; refused only if the stored version is already >= V), ``CREATE``
    (``expect_version=0``: absent, or a tombstone), ``NEW`` (an id this process just
    made: no row can exist, a plain INSERT) or ``WriteMode.expect(v)`` (compare and
    set: the stored version is ``v``)."""

    kind: str
    expected: int = 0  # the stored version a compare-and-set expects (CREATE: 0)

    @classmethod
    def expect(cls, version: int) -> WriteMode:
        """Compare and set: the stored version must be ``version`` (>= 1)."""
        return cls("cas", version)


BLIND = WriteMode("blind")
CREATE = WriteMode("create")
NEW = WriteMode("new")


@dataclass(slots=True)
class IndexRow:
    """One index row of one entity, placed on a logical shard."""

    index: Index
    shard: int
    values: tuple[Any, ...]
    entity_id: bytes
    version: int


@dataclass(slots=True)
class PreparedWrite:
    """An entity checked and encoded for a put: its body, and its rows by index name."""

    entity_id: bytes
    shard: int
    body: bytes
    rows: dict[str, set[tuple[Any, ...]]]


@dataclass(slots=True)
class EntityWrite:
    """Step 2 for one entity."""

    db: str
    shard: int
    entity_id: bytes
    version: int
    updated: int
    body: bytes | None  # None: delete (write a tombstone)
    mode: WriteMode
    want_body: bool  # return the old body (needed when indexes are maintained)
    keys: tuple[bytes, ...] | None = None  # counted indexes' keys of the body (schemaless.counts)


#: From this many rows a step 1 batch locks its shards' ``owned`` rows once
#: (``owned.locked``, a compound statement of about 150 µs of server CPU) instead of
#: each present row's update trigger looking its shard up (about 17 µs a row; a new
#: row meets the guard key, which costs nothing measurable).
LOCKED_ROWS = 16


def upsert_rows_sql(
    rows: Sequence[IndexRow], dbs: Sequence[str], owned: str | None = None
) -> tuple[str, list[Any]]:
    """Step 1: one multi-row upsert per (logical shard, index) table (``owned``: the
    owned layout's data database: rows carry their shard; every upsert meets the
    guard, so the batch needs no check; from ``LOCKED_ROWS`` rows it is
    ``locked``)."""
    stmts, params = upserts_sql(rows, dbs, owned is not None)
    if owned is not None and len(rows) >= LOCKED_ROWS:
        return locked(stmts, owned, {r.shard for r in rows}), params
    return triggered(stmts, owned), params


def upserts_sql(
    rows: Iterable[IndexRow], dbs: Sequence[str], shard: bool
) -> tuple[list[str], list[Any]]:
    """Step 1's statements, one multi-row upsert per (logical shard, index) table, for
    a caller's own batch (``shard``: the owned layout's rows carry their shard)."""
    groups: dict[tuple[int, str], list[IndexRow]] = {}
    for row in rows:
        groups.setdefault((row.shard, row.index.name), []).append(row)
    stmts: list[str] = []
    params: list[Any] = []
    for (n, _), group in sorted(groups.items()):
        index = group[0].index
        group.sort(key=lambda r: (r.values, r.entity_id))
        stmts.append(upsert_sql(dbs[n], index, len(group), shard))
        for row in group:
            if shard:
                params.append(row.shard)
            params.extend(row.values)
            params.append(row.entity_id)
            params.append(row.version)
    return stmts, params


def upsert_sql(db: str, index: Index, rows: int, shard: bool = False) -> str:
    """A multi-row upsert of ``rows`` rows into one index table; each row's parameters
    are its values, ``entity_id`` and ``entity_version`` (``shard``: its shard first)."""
    head, one, tail = _upsert_parts(db, index, shard)
    return f"{head}{', '.join([one] * rows)}{tail}"


def upsert_text_sql(db: str, index: Index, rows: str, shard: bool = False) -> str:
    """``upsert_sql`` with the rows given as SQL text: ``(...), (...)``."""
    head, _, tail = _upsert_parts(db, index, shard)
    return f"{head}{rows}{tail}"


_UPSERT_TAIL = (
    " ON DUPLICATE KEY UPDATE"
    " `entity_version` = GREATEST(`entity_version`, VALUES(`entity_version`))"
)
# A unique table's key is the values alone: a row of another owner is left as it is.
_UNIQUE_TAIL = (
    " ON DUPLICATE KEY UPDATE `entity_version` = IF(`entity_id` = VALUES(`entity_id`),"
    " GREATEST(`entity_version`, VALUES(`entity_version`)), `entity_version`)"
)


def owners_sql(db: str, index: Index, values: Sequence[tuple[Any, ...]]) -> tuple[str, list[Any]]:
    """``SELECT values..., entity_id, entity_version`` of a unique index's rows with
    these values (one statement)."""
    cols = [quote(c) for c in index.columns]
    params: list[Any] = []
    if len(cols) == 1:
        where = f"{cols[0]} IN ({', '.join(['%s'] * len(values))})"
        params = [v[0] for v in values]
    else:
        one = "(" + " AND ".join(f"{c} = %s" for c in cols) + ")"
        where = " OR ".join([one] * len(values))
        params = [x for v in values for x in v]
    return (
        f"SELECT {', '.join(cols)}, `entity_id`, `entity_version`"
        f" FROM {quote(db, index.table)} WHERE {where}",
        params,
    )


def takeover_sql(row: IndexRow, db: str, owner: bytes, seen: int) -> tuple[str, list[Any]]:
    """Give a unique row to ``row``'s entity, only if it still names ``owner`` at
    version ``seen`` (the version guard of a takeover)."""
    where = " AND ".join(f"{quote(c)} = %s" for c in row.index.columns)
    return (
        f"UPDATE {quote(db, row.index.table)} SET `entity_id` = %s, `entity_version` = %s"
        f" WHERE {where} AND `entity_id` = %s AND `entity_version` = %s",
        [row.entity_id, row.version, *row.values, owner, seen],
    )


def release_sql(
    rows: Iterable[IndexRow], dbs: Sequence[str], owned: str | None = None
) -> tuple[str, list[Any]]:
    """Delete rows exactly as this write claimed them (entity and version): the
    unique rows of a new entity whose put was refused."""
    stmts: list[str] = []
    params: list[Any] = []
    for row in rows:
        where = " AND ".join(f"{quote(c)} = %s" for c in row.index.columns)
        stmts.append(
            f"DELETE FROM {quote(dbs[row.shard], row.index.table)} WHERE {where}"
            " AND `entity_id` = %s AND `entity_version` = %s"
        )
        params += [*row.values, row.entity_id, row.version]
    return triggered(stmts, owned), params


def later_sql(at: str) -> str:
    """The ``updated`` of a write of an entity row: its time ``at`` (an SQL expression),
    and always past the stored one, so that every write that changes the row moves
    ``by_updated``, the owned layout's guard key's index (``owned.entities_table_sql``);
    two writes within a microsecond stay ordered too."""
    return f"GREATEST({at}, `updated` + 1)"


def fence_owner_sql(
    db: str, owner: bytes, seen: int | None, version: int, now: int, shard: int | None = None
) -> tuple[str, list[Any]]:
    """Raise an entity to ``version`` if it is still as read: at ``seen`` (body
    unchanged; ``updated`` moved, as by every write of an entity row, a tombstone's to
    now, so it is not purged soon), or with
    no row (``seen`` None: a tombstone is written).  One result set: the rows changed.
    ``shard``: the owned layout's shard of the entity (its row carries it)."""
    table = quote(db, "entities")
    if seen is None:
        lead = [] if shard is None else [shard]  # the owned layout's rows carry it
        sql = (
            f"INSERT INTO {table} ({'`shard`, ' * len(lead)}`id`, `version`, `updated`)"
            f" VALUES ({'%s, ' * len(lead)}%s, %s, %s) ON DUPLICATE KEY UPDATE `id` = `id`"
        )
        params: list[Any] = [*lead, owner, version, now]
    else:
        sql = (
            f"UPDATE {table} SET `version` = %s,"
            f" `updated` = IF(`body` IS NULL, {later_sql('%s')}, `updated` + 1)"
            " WHERE `id` = %s AND `version` = %s"
        )
        params = [version, now, owner, seen]
    return sql + "; SELECT ROW_COUNT()", params


@functools.lru_cache(maxsize=4096)
def _upsert_parts(db: str, index: Index, shard: bool) -> tuple[str, str, str]:
    """An index table's upsert: its head, one row's placeholders, its guarded tail."""
    cols = ", ".join(quote(c) for c in (["shard"] if shard else []) + list(index.columns))
    head = f"INSERT INTO {quote(db, index.table)} ({cols}, `entity_id`, `entity_version`) VALUES "
    one = "(" + ", ".join(["%s"] * (len(index.columns) + 2 + shard)) + ")"
    return head, one, _UNIQUE_TAIL if index.unique else _UPSERT_TAIL


def delete_rows_sql(
    rows: Iterable[IndexRow], dbs: Sequence[str], owned: str | None = None
) -> tuple[str, list[Any]]:
    """Step 3: delete rows of an old body, guarded by ``entity_version < V``."""
    rows = sorted(rows, key=lambda r: (r.shard, r.index.name, r.values, r.entity_id))
    stmts: list[str] = []
    params: list[Any] = []
    for row in rows:
        where = " AND ".join(f"{quote(c)} = %s" for c in row.index.columns)
        stmts.append(
            f"DELETE FROM {quote(dbs[row.shard], row.index.table)} WHERE {where}"
            " AND `entity_id` = %s AND `entity_version` < %s"
        )
        params.extend(row.values)
        params.append(row.entity_id)
        params.append(row.version)
    return triggered(stmts, owned), params


def entity_batch_sql(
    writes: Sequence[EntityWrite],
    rows: Sequence[IndexRow] = (),
    dbs: Sequence[str] = (),
    fence: str | None = None,
    changes: bool = False,
    owned: str | None = None,
    tentative_ok: bool = False,
) -> tuple[str, list[Any], int]:
    """Step 2: write each entity with one atomic conditional statement, in one round
    trip; return the SQL, its parameters and the position of the first write among the
    statements without a result set (whose affected-row counts say what applied).

    ``rows``: index rows of these entities on the same server, upserted first in the
    same transaction (committed with their entity, never after).  With indexes, each
    write is preceded by a read of the old body (NULL for a tombstone: a hint of which
    rows step 3 removes).  Entities go in id order: concurrent batches cannot deadlock.

    ``fence``: the writer's index epoch's fence table, read by the first write of a body
    on each shard (version + its ``COUNT(*)``, 0) and held until the commit: dropping it
    waits for the write, and one from an older map fails (``TableMissing``).
    ``changes``: the feed is on: head rows locked first, a change row per applied write.

    ``owned``: the owned layout's data database: rows carry their shard.  A batch
    whose every write ``fires`` (meets the guard) is ``triggered``; one with a write that
    may match no row is ``checked_first`` (the ``owned`` rows locked before its first
    write), or, with ``tentative_ok``, ``tentative``: no check, and the caller sends
    each such write that affected no row again without ``tentative_ok``.

    Writes with ``keys`` (counted indexes) are each followed by a statement that keeps
    their affected rows in a session variable (so the writes' counts are every other
    statement: ``write_position``), and the batch ends with their count statements
    (``counts.maintain_sql``: only a write that applied changes a count).
    """
    shard = owned is not None
    stmts, params = upserts_sql(rows, dbs, shard)
    ordered = sorted(writes, key=lambda w: (w.shard, w.entity_id))
    feed_tail: tuple[list[str], list[Any]] = ([], [])
    if changes:
        heads, feed_tail = feed_sql(ordered, shard)
        stmts += heads
    upserts = len(stmts)
    writing, counting = _writes_sql(ordered, fence, shard)
    stmts += writing[0] + feed_tail[0] + counting[0]
    params += writing[1] + feed_tail[1] + counting[1]
    first = 1 + upserts if len(stmts) > 1 else 0
    if owned is None or all(fires(w) for w in writes):
        return triggered(stmts, owned), params, first
    if tentative_ok:
        return tentative(stmts, owned), params, first
    shards = [w.shard for w in writes] + [r.shard for r in rows]
    return checked_first(stmts, owned, shards), params, 2 + upserts  # START, the check


Statements = tuple[list[str], list[Any]]


def _writes_sql(
    ordered: Sequence[EntityWrite], fence: str | None, shard: bool
) -> tuple[Statements, Statements]:
    """Step 2's writes in their order (each a counted one's ``ROW_COUNT()`` kept
    after it; the first body of each shard reading ``fence``), and the counts'
    statements that follow them."""
    writing: Statements = ([], [])
    counting: Statements = ([], [])
    fenced: set[str] = set()
    for n, w in enumerate(ordered):
        kind = _kind(w)
        shard_fence = None
        if fence is not None and w.body is not None and w.db not in fenced:
            fenced.add(w.db)
            shard_fence = fence
        writing[0].append(_entity_sql(w.db, kind, w.want_body, shard_fence, shard))
        writing[1].extend(_entity_params(w, kind, shard))
        if w.keys is not None:
            writing[0].append(f"SET {APPLIED}{n} = ROW_COUNT()")
            applied, fresh = f"{APPLIED}{n}", kind == "new"
            more, values = maintain_sql(w.db, w.shard, w.entity_id, w.keys, applied, fresh)
            counting[0].extend(more)
            counting[1].extend(values)
    return writing, counting


def write_position(first: int, n: int, writes: Sequence[EntityWrite]) -> int:
    """The place, among a step 2 batch's statements without a result set, of the
    affected rows of its ``n``-th write in (shard, id) order (``first``: of the first)."""
    return first + n * (2 if writes and writes[0].keys is not None else 1)


def _entity_params(w: EntityWrite, kind: str, shard: bool) -> list[Any]:
    """The parameters of ``_entity_sql``'s statements for one write."""
    read: list[Any] = [w.entity_id] if w.want_body else []
    if kind in ("blind", "create", "new"):
        placed = [w.shard] if shard else []
        return [*read, *placed, w.entity_id, w.version, w.updated, w.body]
    if kind == "cas":
        return [*read, w.body, w.updated, w.version, w.entity_id, w.mode.expected]
    guard = w.version if kind == "delete" else w.mode.expected
    return [*read, w.updated, w.version, w.entity_id, guard]


#: The kinds of write whose statement always meets the guard (an insert: its key; an
#: upsert: its key, or for a row present its update trigger, which fires even when the
#: row stays as it is); the others are updates that may match no row, whose batch
#: checks ownership (docs/architecture.md, "Step 3").
_FIRES = frozenset({"blind", "create", "new"})


def fires(w: EntityWrite) -> bool:
    """Whether ``w``'s statement always meets the guard, so that it proves its shard
    owned even when it changes nothing."""
    return _kind(w) in _FIRES


def feed_sql(
    ordered: Sequence[EntityWrite], shard: bool = False
) -> tuple[list[str], tuple[list[str], list[Any]]]:
    """The change feed's statements of step 2 (docs/architecture.md, "The change feed"):
    the head row of each logical shard written, locked before any entity row (shard
    order); after the writes, one change row per write that applied (copied from the
    entity row on the server, numbered from the head), and the heads stored.  Returns
    the statements before the writes (no result set; counted into the offset of the
    first write), and those after every write with their parameters, so the writes'
    affected-row counts stay consecutive.  ``shard``: the owned layout (a head row
    per shard, change rows carry their shard)."""
    db_of = {w.shard: w.db for w in ordered}
    shards = sorted(db_of)
    var = {s: f"@schemaless_feed{i}" for i, s in enumerate(shards)}
    head = {s: f"`shard` = {int(s)}" if shard else "`one` = 1" for s in shards}
    # NULL first: a head row that is missing makes the change rows fail (NOT NULL), never
    # take a number left in the pooled session by an earlier batch
    heads = [f"SET {', '.join(f'{v} = NULL' for v in var.values())}"]
    heads += [
        f"SELECT `seq` INTO {var[s]} FROM {quote(db_of[s], 'changes_head')}"
        f" WHERE {head[s]} FOR UPDATE"
        for s in shards
    ]
    cols = "`shard`, " if shard else ""
    after: list[str] = []
    params: list[Any] = []
    for w in ordered:
        v = var[w.shard]
        after.append(
            f"INSERT INTO {quote(w.db, 'changes')} ({cols}`seq`, `id`, `version`, `body`, `at`)"
            f" SELECT {cols}{v} := {v} + 1, `id`, `version`, `body`, `updated`"
            f" FROM {quote(w.db, 'entities')} WHERE `id` = %s AND `version` = %s"
        )
        params += [w.entity_id, w.version]
    after += [
        f"UPDATE {quote(db_of[s], 'changes_head')} SET `seq` = {var[s]} WHERE {head[s]}"
        for s in shards
    ]
    return heads, (after, params)


def _kind(w: EntityWrite) -> str:
    if w.body is None:
        return "delete" if w.mode is BLIND else "delete_cas"
    return w.mode.kind


@functools.lru_cache(maxsize=4096)
def _entity_sql(
    db: str, kind: str, want_body: bool, fence: str | None = None, shard: bool = False
) -> str:
    """The statements of one entity's step 2 (their parameters: see entity_batch_sql).

    Each write applies only if the stored version is below the new one (and, for
    compare-and-set, equal to the expected one), so versions only grow; a write that
    does not apply changes nothing and affects 0 rows.  A NEW write is a plain INSERT:
    the server's conditional upsert costs it 30-50 µs more, and no row can be there.
    With ``fence``, the version is ``V + (SELECT COUNT(*) FROM <fence>)``, always V.
    """
    table = quote(db, "entities")
    version = f"%s + (SELECT COUNT(*) FROM {quote(db, fence)})" if fence else "%s"
    stmts = []
    later, given = later_sql("VALUES(`updated`)"), later_sql("%s")
    if want_body:
        stmts.append(f"SELECT `body` FROM {table} WHERE `id` = %s")  # NULL: a tombstone
    cols, marks = ("`shard`, ", "%s, ") if shard else ("", "")
    insert = (
        f"INSERT INTO {table} ({cols}`id`, `version`, `updated`, `body`)"
        f" VALUES ({marks}%s, {version}, %s, %s)"
    )
    if kind == "new":  # a duplicate id fails the statement (ConflictError), never overwrites
        stmts.append(insert)
    elif kind in ("blind", "create"):
        cond = "`version` < VALUES(`version`)"
        if kind == "create":
            cond = "`body` IS NULL AND " + cond
        # The condition is evaluated once, before any column changes (assignments in
        # ON DUPLICATE KEY UPDATE see the values assigned to their left).
        stmts.append(
            f"{insert} ON DUPLICATE KEY UPDATE `updated` = IF(@ok := ({cond}), {later},"
            " `updated`), `body` = IF(@ok, VALUES(`body`), `body`),"
            " `version` = IF(@ok, VALUES(`version`), `version`)"
        )
    elif kind == "cas":
        stmts.append(
            f"UPDATE {table} SET `body` = %s, `updated` = {given}, `version` = {version}"
            " WHERE `id` = %s AND `version` = %s AND `body` IS NOT NULL"
        )
    else:
        guard = "`version` < %s" if kind == "delete" else "`version` = %s"
        stmts.append(
            f"UPDATE {table} SET `body` = NULL, `updated` = {given}, `version` = %s"
            f" WHERE `id` = %s AND `body` IS NOT NULL AND {guard}"
        )
    return ";\n".join(stmts)
