"""Counted indexes: per-key counters kept by step 2 (docs/architecture.md, "Counts").

An entity contributes one key per distinct equality prefix (lengths 0..k) of its rows
in a counted index; ``counts`` holds, per logical shard and key, how many live
entities contribute it, and ``counted_keys`` which keys each live entity contributed.
Step 2 changes both in the entity's own transaction, only when its write applied
(``maintain_sql``); ``schemaless.counting`` reads them.  Owned layout only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import CatalogError
from .index import Index
from .keys import key_encode
from .names import quote
from .owned import GUARD_KEY, guard_sql, in_guarded_transaction

if TYPE_CHECKING:
    from .topology import Topology

__all__ = [
    "APPLIED",
    "backfill_sql",
    "count_keys",
    "entity_keys",
    "maintain_sql",
    "need_owned",
    "prefix_key",
    "tables_sql",
]

#: The session variable step 2 sets after each counted write: its affected rows,
#: suffixed by the write's place in the batch.
APPLIED = "@schemaless_ck"


def need_owned(topo: Topology, what: str) -> None:
    """Refuse ``what`` on a datastore in the layout of a database per logical shard."""
    if topo.owned_db is None:
        raise CatalogError(
            f"{what} needs the owned layout; this datastore has a database per logical"
            " shard: move it over with `schemaless dump` and `schemaless restore` into a new"
            " datastore (owned by default)"
        )


def tables_sql(db: str) -> list[str]:
    """``counts`` and ``counted_keys`` in the data database, with their guards."""
    return [
        f"CREATE TABLE IF NOT EXISTS {quote(db, 'counts')} ("
        " `shard` SMALLINT UNSIGNED NOT NULL,"
        " `key` BINARY(16) NOT NULL,"
        " `n` BIGINT NOT NULL,"
        f" PRIMARY KEY (`shard`, `key`), {GUARD_KEY}"
        ") ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {quote(db, 'counted_keys')} ("
        " `shard` SMALLINT UNSIGNED NOT NULL,"
        " `id` BINARY(16) NOT NULL,"
        " `key` BINARY(16) NOT NULL,"
        f" PRIMARY KEY (`shard`, `id`, `key`), {GUARD_KEY}"
        ") ENGINE=InnoDB",
        *guard_sql(db, "counts"),
        *guard_sql(db, "counted_keys"),
    ]


def prefix_key(index: Index, created: int, values: Sequence[Any]) -> bytes:
    """The 16-byte key of an equality prefix (coerced values) of a counted index
    (``created``: the index's creation time in the catalog)."""
    h = hashlib.blake2b(digest_size=16, person=b"schemaless-cnt")
    h.update(f"{index.name}\0{created}\0{len(values)}".encode())
    for value in values:
        encoded = key_encode(value)
        h.update(len(encoded).to_bytes(4, "big"))
        h.update(encoded)
    return h.digest()


def count_keys(index: Index, created: int, rows: Iterable[tuple[Any, ...]]) -> set[bytes]:
    """The keys an entity with these index rows contributes: one per distinct prefix
    of length 0..k of its rows (none without rows)."""
    prefixes = {row[:j] for row in rows for j in range(len(row) + 1)}
    return {prefix_key(index, created, p) for p in prefixes}


def entity_keys(
    topo: Topology, rows: Mapping[str, Iterable[tuple[Any, ...]]]
) -> tuple[bytes, ...] | None:
    """The sorted keys of an entity whose rows by index name are ``rows`` (an absent
    name: no rows), over every counted index writers maintain; None when there is none
    (nothing for step 2 to keep)."""
    if not topo.counted or topo.owned_db is None:
        return None
    keys: set[bytes] = set()
    for index in topo.counted:
        created = topo.indexes[index.name].created
        keys |= count_keys(index, created, rows.get(index.name, ()))
    return tuple(sorted(keys))


def maintain_sql(
    db: str, shard: int, entity_id: bytes, keys: Sequence[bytes], applied: str, fresh: bool
) -> tuple[list[str], list[Any]]:
    """Step 2's count statements for one entity whose write set ``applied`` (a session
    variable) to its affected rows.  Only if it applied: count the new ``keys`` the
    entity did not contribute, uncount its old keys that are not among them, and store
    the new ones as its keys (the old ones are read on the server: the writer needs
    no knowledge of the old body).  ``fresh``: a plain INSERT of a new id, which only
    applies where no row was, so there are no old keys: two statements, not four."""
    counts, ckeys = quote(db, "counts"), quote(db, "counted_keys")
    # hex: a bare parameter in a derived table would be a utf8mb4 string, not bytes
    new = " UNION ALL ".join(["SELECT UNHEX(%s) AS `k`"] * len(keys))
    hexed = [key.hex() for key in keys]
    if fresh:
        return _fresh_sql(counts, ckeys, shard, entity_id, hexed)
    stmts: list[str] = []
    params: list[Any] = []
    if keys:
        stmts.append(
            f"INSERT INTO {counts} (`shard`, `key`, `n`) SELECT %s, v.`k`, 1 FROM ({new}) v"
            f" WHERE {applied} > 0 AND NOT EXISTS (SELECT 1 FROM {ckeys} c"
            " WHERE c.`shard` = %s AND c.`id` = %s AND c.`key` = v.`k`)"
            " ON DUPLICATE KEY UPDATE `n` = `n` + 1"
        )
        params += [shard, *hexed, shard, entity_id]
    stmts += _uncount_sql(counts, ckeys, applied, len(keys))
    params += [shard, entity_id, *hexed, shard, entity_id, *hexed]
    if keys:
        stmts.append(
            f"INSERT INTO {ckeys} (`shard`, `id`, `key`) SELECT %s, %s, v.`k` FROM ({new}) v"
            f" WHERE {applied} > 0 ON DUPLICATE KEY UPDATE `key` = VALUES(`key`)"
        )
        params += [shard, entity_id, *hexed]
    return stmts, params


def _fresh_sql(
    counts: str, ckeys: str, shard: int, entity_id: bytes, hexed: Sequence[str]
) -> tuple[list[str], list[Any]]:
    """A new id's count statements: its INSERT applied, or it failed the batch (no
    condition, no old key; plain multi-row inserts, the cheapest form)."""
    if not hexed:
        return [], []
    rows = ", ".join(["(%s, UNHEX(%s), 1)"] * len(hexed))
    held = ", ".join(["(%s, %s, UNHEX(%s))"] * len(hexed))
    return [
        f"INSERT INTO {counts} (`shard`, `key`, `n`) VALUES {rows}"
        " ON DUPLICATE KEY UPDATE `n` = `n` + 1",
        f"INSERT INTO {ckeys} (`shard`, `id`, `key`) VALUES {held}",
    ], [*(v for k in hexed for v in (shard, k)), *(v for k in hexed for v in (shard, entity_id, k))]


def _uncount_sql(counts: str, ckeys: str, applied: str, kept: int) -> list[str]:
    """Uncount and forget an entity's old keys but the ``kept`` new ones (parameters:
    shard, id and the new keys, twice)."""
    marks = ", ".join(["UNHEX(%s)"] * kept)
    gone = f" AND `key` NOT IN ({marks})" if kept else ""
    return [
        f"UPDATE {counts} n JOIN {ckeys} c ON n.`shard` = c.`shard` AND n.`key` = c.`key`"
        f" SET n.`n` = n.`n` - 1 WHERE {applied} > 0 AND c.`shard` = %s AND c.`id` = %s"
        + gone.replace("`key`", "c.`key`"),
        f"DELETE FROM {ckeys} WHERE {applied} > 0 AND `shard` = %s AND `id` = %s{gone}",
    ]


def backfill_sql(
    db: str, shard: int, entities: Sequence[tuple[bytes, int, Sequence[bytes]]]
) -> tuple[str, list[Any]]:
    """The backfill of one counted index's keys: for each ``(id, version read, its
    keys for the index)`` whose entity is still live at that version (its row locked,
    as a writer's write locks it), count and store the keys it does not hold yet.
    One transaction, ending with the ownership check."""
    counts, ckeys, table = quote(db, "counts"), quote(db, "counted_keys"), quote(db, "entities")
    stmts: list[str] = []
    params: list[Any] = []
    for n, (entity_id, version, keys) in enumerate(entities):
        live = f"{APPLIED}b{n}"
        new = " UNION ALL ".join(["SELECT UNHEX(%s) AS `k`"] * len(keys))
        hexed = [key.hex() for key in keys]
        stmts += [
            f"SELECT COUNT(*) INTO {live} FROM {table} WHERE `id` = %s AND `version` = %s"
            " AND `body` IS NOT NULL FOR UPDATE",
            f"INSERT INTO {counts} (`shard`, `key`, `n`) SELECT %s, v.`k`, 1 FROM ({new}) v"
            f" WHERE {live} > 0 AND NOT EXISTS (SELECT 1 FROM {ckeys} c"
            " WHERE c.`shard` = %s AND c.`id` = %s AND c.`key` = v.`k`)"
            " ON DUPLICATE KEY UPDATE `n` = `n` + 1",
            f"INSERT INTO {ckeys} (`shard`, `id`, `key`) SELECT %s, %s, v.`k` FROM ({new}) v"
            f" WHERE {live} > 0 ON DUPLICATE KEY UPDATE `key` = VALUES(`key`)",
        ]
        params += [entity_id, version, shard, *hexed, shard, entity_id]
        params += [shard, entity_id, *hexed]
    return in_guarded_transaction(stmts, db, [shard]), params
