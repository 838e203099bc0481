"""An edge type's tables and triggers (``schemaless.edges``): their names and the SQL
that makes them, below the modules that copy them (moves, dumps)."""

from __future__ import annotations

import re

from .errors import InvalidQuery
from .names import quote
from .owned import COPYING, GUARD_KEY, guard_sql, upsert_guard_sql

__all__ = [
    "NOCOUNT",
    "PAIRING",
    "check_type",
    "count_trigger_sql",
    "pairing",
    "pairing_note",
    "table_names",
    "tables_sql",
    "triggers_sql",
]

_TYPE = re.compile(r"[a-z](?:_?[a-z0-9]){0,39}\Z")
#: The session variable of a writer whose edge rows come with their counts (``add``'s
#: transaction, a restore): the count trigger does not count them.
NOCOUNT = "@schemaless_nocount"


#: The pattern of an edge table's comment that records its pairing, made with the
#: tables (and by ``schemaless edges create`` on tables made before): ``schemaless
#: inverse: liked_by`` on a type's table, ``schemaless inverse of: likes`` on its
#: inverse's (a dump's definitions may carry it).
PAIRING = r"schemaless (inverse|inverse of): ([a-z](?:_?[a-z0-9]){0,39})"
_NOTE = re.compile(PAIRING + r"\Z")


def pairing_note(role: str, other: str) -> str:
    """The comment recording that a type's ``inverse`` (or what it is the ``inverse
    of``) is the type ``other``."""
    assert role in ("inverse", "inverse of")
    return f"schemaless {role}: {check_type(other)}"


def pairing(comment: object) -> tuple[str, str] | None:
    """``(role, other type)`` of an edge table's comment; None for none (tables made
    before pairings were recorded) or another comment."""
    found = _NOTE.match(comment) if isinstance(comment, str) else None
    return None if found is None else (found[1], found[2])


def check_type(name: object) -> str:
    """An edge type's name: lower-case letters, digits and single '_' (at most 40)."""
    if not isinstance(name, str) or not _TYPE.match(name):
        raise InvalidQuery(
            f"invalid edge type {name!r}: use lower-case letters, digits and single '_'"
            " (at most 40, starting with a letter)"
        )
    return name


def tables_sql(db: str, kind: str, note: str = "") -> list[str]:
    """The edge table and the count table of one edge type, with their guards: the
    edge table's key and update trigger (``guard_sql``); the count table's ``BEFORE
    INSERT`` trigger (``upsert_guard_sql``), as every write to it but a delete is an
    upsert, whose insert guard fires first, or the edge's count trigger, which runs
    under the edge row's guard of the same shard.  ``note``: the edge table's pairing
    (``pairing_note``), also set on a table made before without one."""
    edges, counts = table_names(kind)
    assert note == "" or pairing(note) is not None
    recorded = [f"ALTER TABLE {quote(db, edges)} COMMENT = '{note}'"] if note else []
    return [
        f"CREATE TABLE IF NOT EXISTS {quote(db, edges)} ("
        " `shard` SMALLINT UNSIGNED NOT NULL,"
        " `src` BINARY(16) NOT NULL,"
        " `dst` BINARY(16) NOT NULL,"
        " `at` BIGINT UNSIGNED NOT NULL,"
        " `touched` BIGINT UNSIGNED NOT NULL,"
        " `data` BLOB NULL,"
        " PRIMARY KEY (`shard`, `src`, `dst`),"
        " KEY `newest` (`shard`, `src`, `at`, `dst`),"
        f" {GUARD_KEY}"
        ") ENGINE=InnoDB",
        *recorded,
        f"CREATE TABLE IF NOT EXISTS {quote(db, counts)} ("
        " `shard` SMALLINT UNSIGNED NOT NULL,"
        " `node` BINARY(16) NOT NULL,"
        " `n` BIGINT NOT NULL,"
        " PRIMARY KEY (`shard`, `node`)"
        ") ENGINE=InnoDB",
        *guard_sql(db, edges),
        *upsert_guard_sql(db, counts),
        *count_trigger_sql(db, edges),
    ]


def table_names(kind: str) -> tuple[str, str]:
    """An edge type's edge table and count table."""
    return f"edges__{kind}", f"edges__{kind}__n"


def count_trigger_sql(db: str, table: str) -> list[str]:
    """The trigger of an edge table (``edges__T``; none for another table) that counts
    a new edge: ``AFTER INSERT``, so an upsert of a present edge (an update) fires none.
    It skips the rows a move copies into the target (``COPYING``, as the guard does)
    and those of a writer that counts them itself (``NOCOUNT``).  It updates the
    present count row (no guard of its own to fire: the edge's insert guard has just
    checked the same shard and holds its ``owned`` row), and upserts a new node's,
    which fires the count table's guard (docs/architecture.md, "Edges and feeds")."""
    kind = table.removeprefix("edges__")
    if kind == table or not _TYPE.match(kind):
        return []
    counts = quote(db, table_names(kind)[1])
    return [
        f"CREATE TRIGGER IF NOT EXISTS {quote(db, f'{table}_ci')} AFTER INSERT ON"
        f" {quote(db, table)} FOR EACH ROW IF {NOCOUNT} IS NULL AND NOT ({COPYING} <=> NEW.`shard`)"
        f" THEN UPDATE {counts} SET `n` = `n` + 1"
        " WHERE `shard` = NEW.`shard` AND `node` = NEW.`src`;"
        f" IF ROW_COUNT() = 0 THEN INSERT INTO {counts} (`shard`, `node`, `n`)"
        " VALUES (NEW.`shard`, NEW.`src`, 1) ON DUPLICATE KEY UPDATE `n` = `n` + 1; END IF;"
        " END IF"
    ]


def triggers_sql(db: str, table: str, create: str) -> list[str]:
    """The triggers of a shard table (a module's) that a move or a restore makes from
    its definition ``create``: the guard, as ``tables_sql`` makes it (an edge type's
    count table ``edges__T__n``: the insert trigger; a table with ``GUARD_KEY``: the
    update trigger; one made before the key: both); and an edge table's count trigger."""
    if table.startswith("edges__") and table.endswith("__n"):
        guards = upsert_guard_sql(db, table)
    elif GUARD_KEY in create:
        guards = guard_sql(db, table)
    else:
        guards = [*upsert_guard_sql(db, table), *guard_sql(db, table)]
    return [*guards, *count_trigger_sql(db, table)]
