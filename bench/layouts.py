"""The storage layouts of issue 23's prototype: their tables and statement shapes.

Every layout holds the same entities (bodies from :class:`schemaless.codec.Codec`) and
one index, ``by_user`` on ``(user_id, published)`` sharded on ``user_id``, with the
logical shards placed alike (shard ``s`` on server ``s % servers``):

* ``a_union``: today's, one database per logical shard (the library's DDL); a
  statement has one ``UNION ALL`` part per logical shard it reads.
* ``a_multi``: today's tables, one statement per logical shard, all of a server's
  statements in one multi-statement round trip (no ``UNION ALL``); the client merges.
* ``b_lead``: one table per server, the logical shard as the leading key column, no
  partitions; rows are named by ``(shard, id) IN (...)``.
* ``b_key``: one table per server keyed as a plain table is (``UNIQUE(id)``; the
  index's columns first), the shard a column (entities clustered on ``(shard,
  added_id)``, as in every one-table layout, so a move keeps ``added_id``).
* ``d_owned``: ``b_key``'s tables plus ``owned``, a row per logical shard the server
  holds: every read batch counts the rows of the shards it read (a stale map raises
  :class:`StaleMap`) and a write names the row, so a move's fence is one row's ``DELETE``.
* ``c_row`` / ``c_in``: one table per server ``PARTITION BY LIST (shard)`` (a partition
  per logical shard it holds), pruned by ``(shard, id) IN (...)`` or by
  ``shard IN (...) AND id IN (...)``; the index's key leads with its columns, so a
  scatter is one ordered scan the server merges over the partitions.

The operations: get_many of ids; an equality query (one user's newest rows, then the
entities); a scatter query (the first rows of ``user_id >= x`` over every shard, then
the entities).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemaless.codec import Codec
from schemaless.hashing import shard_of
from schemaless.names import quote
from schemaless.schema import entities_table_sql

from . import ownedsql
from .data import Dataset
from .env import RawClient
from .ops import BY_USER

__all__ = [
    "EQ_LIMIT",
    "LAYOUTS",
    "SCATTER_LIMIT",
    "TABLES",
    "Data",
    "Layout",
    "Placement",
    "make_data",
]

EQ_LIMIT = 20
SCATTER_LIMIT = 100
LAYOUTS = ("a_union", "a_multi", "b_lead", "b_key", "d_owned", "c_row", "c_in")
#: the physical tables behind each layout (a_union and a_multi share today's, ...)
TABLES = {
    "a_union": "a",
    "a_multi": "a",
    "b_lead": "b_lead",
    "b_key": "b_key",
    "d_owned": "d",
    "c_row": "c",
    "c_in": "c",
}
_IDX_COLS = ", ".join(quote(c) for c in BY_USER.columns)
_ORDER = ", ".join(quote(c) for c in (*BY_USER.columns, "entity_id"))
_ENT_COLS = " (`id`, `version`, `updated`, `body`)"


@dataclass(frozen=True)
class Placement:
    """Where things are: database names and the logical shard -> server map."""

    prefix: str  # e.g. "lay32": databases <prefix>_s0007 and <prefix>_one
    n_shards: int
    servers: int
    moved: dict[int, int] = field(default_factory=dict)  # shard -> server, after a move

    def sid(self, shard: int) -> int:
        return self.moved.get(shard, shard % self.servers)

    def shards_on(self, sid: int) -> list[int]:
        return [s for s in range(self.n_shards) if self.sid(s) == sid]

    def shard_db(self, shard: int) -> str:
        return f"{self.prefix}_s{shard:04d}"

    @property
    def one_db(self) -> str:
        return f"{self.prefix}_one"

    @property
    def side_db(self) -> str:
        return f"{self.prefix}_side"

    def databases(self) -> list[str]:
        return [self.shard_db(s) for s in range(self.n_shards)] + [self.one_db, self.side_db]


@dataclass
class Data:
    """The rows every layout is loaded with."""

    entities: list[tuple[int, bytes, int, bytes]]  # (shard, id, updated, body)
    index: list[tuple[int, bytes, int, bytes]]  # (shard, user_id, published, entity_id)
    users: list[bytes]


def make_data(ds: Dataset, n_shards: int, codec: Codec) -> Data:
    """Entities ``0 .. ds.n-1`` and their by_user rows, each with its logical shard."""
    entities, index = [], []
    for i in range(ds.n):
        e = ds.entity(i)
        entities.append((shard_of(e["id"], n_shards), e["id"], e["updated"], codec.encode(e)))
        for row in BY_USER.rows(e):
            ishard = shard_of(BY_USER.shard_key(row), n_shards)
            index.append((ishard, row[0], row[1], e["id"]))
    return Data(entities, index, [ds.user_id(u) for u in range(ds.users)])


def _marks(n: int, mark: str = "%s") -> str:
    return ", ".join([mark] * n)


class Layout:
    """One layout: DDL, loading, and the statements of each operation on a server."""

    name = "a_union"

    def __init__(self, place: Placement, raw: RawClient, codec: Codec) -> None:
        self.place, self.raw, self.codec = place, raw, codec

    # -- statements (overridden per layout) ----------------------------------------------

    def fetch_sql(self, by_shard: dict[int, list[bytes]]) -> tuple[str, list[Any]]:
        """One server's batch selecting ``(id, body)`` of these ids."""
        parts, params = [], []
        for shard, keys in sorted(by_shard.items()):
            parts.append(
                f"SELECT `id`, `body` FROM {quote(self.place.shard_db(shard), 'entities')}"
                f" WHERE `id` IN ({_marks(len(keys))})"
            )
            params += keys
        return self._join(parts), params

    def eq_sql(self, shard: int) -> str:
        """One user's newest entity ids on their shard (parameter: the user id)."""
        return (
            f"SELECT `entity_id` FROM {quote(self.place.shard_db(shard), BY_USER.table)}"
            f" WHERE `p_user_id` = %s ORDER BY `p_published` DESC, `entity_id` DESC"
            f" LIMIT {EQ_LIMIT}"
        )

    def scatter_sql(self, shards: Sequence[int], low: bytes) -> tuple[str, list[Any]]:
        """One server's first index rows of ``user_id >= low`` over its shards."""
        parts = [
            f"(SELECT {_IDX_COLS}, `entity_id`"
            f" FROM {quote(self.place.shard_db(s), BY_USER.table)} WHERE `p_user_id` >= %s"
            f" ORDER BY {_ORDER} LIMIT {SCATTER_LIMIT})"
            for s in shards
        ]
        sql = " UNION ALL ".join(parts)
        if len(parts) > 1:
            sql += f" ORDER BY {_ORDER} LIMIT {SCATTER_LIMIT}"
        return sql, [low] * len(parts)

    def _join(self, parts: list[str]) -> str:
        return " UNION ALL ".join(parts)

    # -- operations ----------------------------------------------------------------------

    def get_many(self, keys: Sequence[bytes]) -> list[dict[str, Any] | None]:
        """The entities of these ids, in order (servers in parallel)."""
        place = self.place
        by_sid: dict[int, dict[int, list[bytes]]] = {}
        for key in keys:
            shard = shard_of(key, place.n_shards)
            by_sid.setdefault(place.sid(shard), {}).setdefault(shard, []).append(key)
        calls = {
            sid: (*self.fetch_sql(by_shard), list(by_shard)) for sid, by_shard in by_sid.items()
        }
        found = {}
        for key, body in self._send(calls):
            found[bytes(key)] = self.codec.decode(body)
        return [found.get(k) for k in keys]

    def query_eq(self, user: bytes) -> list[dict[str, Any] | None]:
        """One user's newest entities (one server, then the entities)."""
        shard = shard_of(BY_USER.shard_key((user, 0)), self.place.n_shards)
        rows = self._send({self.place.sid(shard): (self.eq_sql(shard), [user], [shard])})
        return self.get_many([bytes(r[0]) for r in rows])

    def scatter(self, low: bytes) -> list[dict[str, Any] | None]:
        """The first entities of ``user_id >= low`` over all shards (every server)."""
        calls = {}
        for sid in range(self.place.servers):
            shards = self.place.shards_on(sid)
            if shards:
                calls[sid] = (*self.scatter_sql(shards, low), shards)
        rows = sorted((bytes(u), int(p), bytes(e)) for u, p, e in self._send(calls))
        return self.get_many([e for _, _, e in rows[:SCATTER_LIMIT]])

    def _send(self, calls: dict[int, tuple[str, list[Any], list[int]]]) -> list[tuple[Any, ...]]:
        """One batch per server (sql, params, the shards it reads); every row."""
        results = self.raw.fanout({sid: (sql, params) for sid, (sql, params, _) in calls.items()})
        return [row for sets in results.values() for rows in sets for row in rows]

    # -- tables --------------------------------------------------------------------------

    def create(self) -> None:
        """Create this layout's tables (and databases) on every server."""
        for sid in range(self.place.servers):
            self.raw.run(sid, ";\n".join(self.ddl(sid)))

    def ddl(self, sid: int) -> list[str]:
        out = []
        for shard in self.place.shards_on(sid):
            db = self.place.shard_db(shard)
            out += [f"CREATE DATABASE IF NOT EXISTS {quote(db)}", entities_table_sql(db)]
            out.append(BY_USER.create_table_sql(db))
        return out

    def load(self, data: Data, batch: int = 500) -> None:
        """Insert every row, a batch of rows per round trip."""
        for sid, table, rows in self._row_groups(data):
            for k in range(0, len(rows), batch):
                self.raw.run(sid, *_insert(table, rows[k : k + batch]))

    def _row_groups(self, data: Data) -> Iterable[tuple[int, str, list[tuple[Any, ...]]]]:
        """(server, table, rows in that table's column order) of every table."""
        ent: dict[int, list[tuple[Any, ...]]] = {}
        idx: dict[int, list[tuple[Any, ...]]] = {}
        for shard, key, updated, body in data.entities:
            ent.setdefault(shard, []).append((key, 1, updated, body))
        for shard, user, published, entity in data.index:
            idx.setdefault(shard, []).append((user, published, entity, 1))
        for shard in range(self.place.n_shards):
            db, sid = self.place.shard_db(shard), self.place.sid(shard)
            cols = f" ({_IDX_COLS}, `entity_id`, `entity_version`)"
            yield sid, quote(db, "entities") + _ENT_COLS, ent.get(shard, [])
            yield sid, quote(db, BY_USER.table) + cols, idx.get(shard, [])


class MultiLayout(Layout):
    """Today's tables, one statement per shard in one multi-statement round trip."""

    name = "a_multi"

    def _join(self, parts: list[str]) -> str:
        return ";\n".join(parts)

    def scatter_sql(self, shards: Sequence[int], low: bytes) -> tuple[str, list[Any]]:
        parts = [
            f"SELECT {_IDX_COLS}, `entity_id`"
            f" FROM {quote(self.place.shard_db(s), BY_USER.table)} WHERE `p_user_id` >= %s"
            f" ORDER BY {_ORDER} LIMIT {SCATTER_LIMIT}"
            for s in shards
        ]
        return ";\n".join(parts), [low] * len(parts)


class OneTableLayout(Layout):
    """One entities table and one index table per server, the shard in every row."""

    name = "b_lead"
    tables: tuple[str, ...] = ("entities_b", "index_b")
    hint = ""  # an index hint of the entities' reads by id
    #: the keys of the two tables: (entities, index)
    keys = (
        "PRIMARY KEY (`shard`, `added_id`), KEY `added` (`added_id`),"
        " UNIQUE KEY `by_id` (`shard`, `id`), KEY `by_updated` (`shard`, `updated`)",
        "PRIMARY KEY (`shard`, `p_user_id`, `p_published`, `entity_id`),"
        " KEY `by_entity` (`shard`, `entity_id`)",
    )

    def table(self, i: int) -> str:
        return quote(self.place.one_db, self.tables[i])

    def fetch_sql(self, by_shard: dict[int, list[bytes]]) -> tuple[str, list[Any]]:
        pairs = [(shard, key) for shard, keys in sorted(by_shard.items()) for key in keys]
        sql = (
            f"SELECT `id`, `body` FROM {self.table(0)}{self.hint}"
            f" WHERE (`shard`, `id`) IN ({_marks(len(pairs), '(%s, %s)')})"
        )
        return sql, [x for pair in pairs for x in pair]

    def eq_sql(self, shard: int) -> str:
        return (
            f"SELECT `entity_id` FROM {self.table(1)} WHERE `shard` = {int(shard)}"
            f" AND `p_user_id` = %s ORDER BY `p_published` DESC, `entity_id` DESC"
            f" LIMIT {EQ_LIMIT}"
        )

    def scatter_sql(self, shards: Sequence[int], low: bytes) -> tuple[str, list[Any]]:
        sql = (
            f"SELECT {_IDX_COLS}, `entity_id` FROM {self.table(1)} WHERE `p_user_id` >= %s"
            f" ORDER BY {_ORDER} LIMIT {SCATTER_LIMIT}"
        )
        return sql, [low]

    def ddl(self, sid: int) -> list[str]:
        types = zip(BY_USER.columns, BY_USER.types, strict=True)
        idx_cols = ", ".join(f"{quote(c)} {t.sql} NOT NULL" for c, t in types)
        return [
            f"CREATE DATABASE IF NOT EXISTS {quote(self.place.one_db)}",
            f"CREATE TABLE IF NOT EXISTS {self.table(0)} (`shard` SMALLINT UNSIGNED NOT NULL,"
            " `added_id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT, `id` BINARY(16) NOT NULL,"
            " `version` BIGINT UNSIGNED NOT NULL, `updated` BIGINT UNSIGNED NOT NULL,"
            f" `body` MEDIUMBLOB NULL, {self.keys[0]}) ENGINE=InnoDB{self.partitions(sid)}",
            f"CREATE TABLE IF NOT EXISTS {self.table(1)} (`shard` SMALLINT UNSIGNED NOT NULL,"
            f" {idx_cols}, `entity_id` BINARY(16) NOT NULL,"
            f" `entity_version` BIGINT UNSIGNED NOT NULL, {self.keys[1]}) ENGINE=InnoDB"
            f" DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin{self.partitions(sid)}",
        ]

    def partitions(self, sid: int) -> str:
        return ""

    def _row_groups(self, data: Data) -> Iterable[tuple[int, str, list[tuple[Any, ...]]]]:
        ent: dict[int, list[tuple[Any, ...]]] = {}
        idx: dict[int, list[tuple[Any, ...]]] = {}
        place = self.place
        for shard, key, updated, body in data.entities:
            ent.setdefault(place.sid(shard), []).append((shard, key, 1, updated, body))
        for shard, user, published, entity in data.index:
            idx.setdefault(place.sid(shard), []).append((shard, user, published, entity, 1))
        for sid in range(place.servers):
            cols = f" (`shard`, {_IDX_COLS}, `entity_id`, `entity_version`)"
            yield (
                sid,
                self.table(0) + " (`shard`, `id`, `version`, `updated`, `body`)",
                ent.get(sid, []),
            )
            yield sid, self.table(1) + cols, idx.get(sid, [])


class KeyTableLayout(OneTableLayout):
    """One table per server keyed like a plain table; the shard a trailing column."""

    name = "b_key"
    tables: tuple[str, ...] = ("entities_k", "index_k")
    keys = (
        "PRIMARY KEY (`shard`, `added_id`), KEY `added` (`added_id`), UNIQUE KEY `by_id` (`id`),"
        " KEY `by_updated` (`updated`)",
        "PRIMARY KEY (`p_user_id`, `p_published`, `entity_id`), KEY `by_entity` (`entity_id`),"
        " KEY `by_shard` (`shard`)",
    )

    def fetch_sql(self, by_shard: dict[int, list[bytes]]) -> tuple[str, list[Any]]:
        keys = [key for keys in by_shard.values() for key in keys]
        sql = f"SELECT `id`, `body` FROM {self.table(0)} WHERE `id` IN ({_marks(len(keys))})"
        return sql, keys

    def eq_sql(self, shard: int) -> str:
        return (
            f"SELECT `entity_id` FROM {self.table(1)} WHERE `p_user_id` = %s"
            f" ORDER BY `p_published` DESC, `entity_id` DESC LIMIT {EQ_LIMIT}"
        )


class StaleMap(Exception):
    """A server does not own every shard a statement read there (a moved shard)."""


class OwnedLayout(KeyTableLayout):
    """b_key's tables plus an ``owned`` table per server: a row per logical shard it
    holds.  Every read batch ends with a count of the owned rows of the shards it read
    (a stale map is detected, as a RENAME's "doesn't exist" does today); a write names
    the shard's row (``INSERT ... SELECT ... FROM owned``), so the fence of a move is a
    ``DELETE`` of that row: a row lock, on that shard only."""

    name = "d_owned"
    tables: tuple[str, ...] = ("entities_d", "index_d", "owned")

    def scatter_sql(self, shards: Sequence[int], low: bytes) -> tuple[str, list[Any]]:
        # without the hint, the optimizer weighs a range per shard on `by_shard` (~2 ms
        # at 256 shards) before it takes the ordered scan of the primary key
        sql = (
            f"SELECT {_IDX_COLS}, `entity_id` FROM {self.table(1)} IGNORE INDEX (`by_shard`)"
            f" WHERE `p_user_id` >= %s AND `shard` IN ({_ints(shards)})"
            f" ORDER BY {_ORDER} LIMIT {SCATTER_LIMIT}"
        )
        return sql, [low]

    def batches(
        self, calls: dict[int, tuple[str, list[Any], list[int]]]
    ) -> dict[int, tuple[str, list[Any]]]:
        """Each server's read batch, the count of its shards' ``owned`` rows last."""
        db = ownedsql.OwnedDb(self.place.one_db)
        return {
            sid: (ownedsql.read_batch(db, [sql], shards), params)
            for sid, (sql, params, shards) in calls.items()
        }

    def _send(self, calls: dict[int, tuple[str, list[Any], list[int]]]) -> list[tuple[Any, ...]]:
        out = []
        for sid, sets in self.raw.fanout(self.batches(calls)).items():
            if ownedsql.stale_shards(sets, calls[sid][2]):
                raise StaleMap(f"server {sid} does not own all of {calls[sid][2]}")
            out += [row for rows in sets[:-1] for row in rows]
        return out

    def ddl(self, sid: int) -> list[str]:
        owned = (
            f"CREATE TABLE IF NOT EXISTS {self.table(2)}"
            " (`shard` SMALLINT UNSIGNED NOT NULL PRIMARY KEY) ENGINE=InnoDB"
        )
        rows = ", ".join(f"({int(s)})" for s in self.place.shards_on(sid))
        return [*super().ddl(sid), owned, f"INSERT INTO {self.table(2)} VALUES {rows}"]


def _ints(values: Iterable[int]) -> str:
    return ", ".join(str(int(v)) for v in values)


class PartitionedLayout(OneTableLayout):
    """One table per server ``PARTITION BY LIST (shard)``, pruned by ``(shard, id) IN``."""

    name = "c_row"
    tables: tuple[str, ...] = ("entities_c", "index_c")
    # Without it the optimizer scans the pruned partitions whole: it prices every range
    # in every partition left (the statement 6-7x slower at 50,000 entities).
    hint = " FORCE INDEX (`by_id`)"
    keys = (
        "PRIMARY KEY (`shard`, `added_id`), KEY `added` (`added_id`),"
        " UNIQUE KEY `by_id` (`id`, `shard`), KEY `by_updated` (`updated`)",
        "PRIMARY KEY (`p_user_id`, `p_published`, `entity_id`, `shard`),"
        " KEY `by_entity` (`entity_id`)",
    )

    def partitions(self, sid: int) -> str:
        parts = ", ".join(_partition(s) for s in self.place.shards_on(sid))
        return f" PARTITION BY LIST (`shard`) ({parts})"


class PartitionedInLayout(PartitionedLayout):
    """The partitioned tables, pruned by ``shard IN (...) AND id IN (...)``."""

    name = "c_in"

    def fetch_sql(self, by_shard: dict[int, list[bytes]]) -> tuple[str, list[Any]]:
        keys = [key for keys in by_shard.values() for key in keys]
        sql = (
            f"SELECT `id`, `body` FROM {self.table(0)}{self.hint}"
            f" WHERE `shard` IN ({_ints(sorted(by_shard))})"
            f" AND `id` IN ({_marks(len(keys))})"
        )
        return sql, keys


def _partition(shard: int) -> str:
    return f"PARTITION `p{int(shard):04d}` VALUES IN ({int(shard)})"


def partition_name(shard: int) -> str:
    """The partition of a logical shard in the partitioned tables."""
    return f"p{int(shard):04d}"


CLASSES: dict[str, type[Layout]] = {
    cls.name: cls
    for cls in (
        Layout,
        MultiLayout,
        OneTableLayout,
        KeyTableLayout,
        OwnedLayout,
        PartitionedLayout,
        PartitionedInLayout,
    )
}


def _insert(table: str, rows: list[tuple[Any, ...]]) -> tuple[str, list[Any]]:
    row = "(" + _marks(len(rows[0])) + ")"
    return f"INSERT INTO {table} VALUES " + ", ".join([row] * len(rows)), [
        x for r in rows for x in r
    ]
