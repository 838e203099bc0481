"""Reading whole logical shards in ``added_id`` order, and index tables by key (the
owned layout's tables hold every shard of their server: read ``WHERE shard = s``,
through the entities' ``KEY by_shard_added (shard, added_id)`` and the index tables' ``KEY
by_shard``, whose entries are ``(shard, primary key)``; each batch ends with the
ownership check)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from schemaless.catalog import Topology
from schemaless.index import Index
from schemaless.names import quote
from schemaless.owned import guarded
from schemaless.scatter import added_page_sql, shard_is
from schemaless.store import DataStore

__all__ = ["EntityRow", "entity_batches", "index_batch", "index_rows"]

#: (added_id, id, version, body or None for a tombstone)
EntityRow = tuple[int, bytes, int, bytes | None]


def entity_batches(
    store: DataStore, topo: Topology, shard: int, after: int = 0, batch: int = 1000
) -> Iterator[list[EntityRow]]:
    """Every entity row of a shard with ``added_id > after``, in batches."""
    server = store.cluster.server_of_shard(topo, shard)
    page = added_page_sql(topo, shard, "`added_id`, `id`, `version`, `body`", batch)
    sql = guarded([page], topo.owned_db, [shard])
    while True:
        rows = server.run(sql, (after,))[0]
        if not rows:
            return
        # the driver already returns int, bytes and None: no copy of each row (a
        # backfill's scan is client-bound)
        out = cast(list[EntityRow], list(rows))
        yield out
        after = out[-1][0]
        if len(out) < batch:
            return


def index_rows(
    store: DataStore, topo: Topology, shard: int, index: Index, batch: int = 5000
) -> Iterator[tuple[tuple[Any, ...], bytes, int]]:
    """Every row of one index table on one shard: ``(values, entity_id, version)``."""
    after: tuple[Any, ...] | None = None
    while True:
        rows = index_batch(store, topo, shard, index, after, batch)
        yield from rows
        if len(rows) < batch:
            return
        values, key, _ = rows[-1]
        after = (*values, key)


def index_batch(
    store: DataStore,
    topo: Topology,
    shard: int,
    index: Index,
    after: tuple[Any, ...] | None,
    batch: int,
    upto: Any = None,
) -> list[tuple[tuple[Any, ...], bytes, int]]:
    """Up to ``batch`` rows of one index table after the primary key ``after``
    (``(values..., entity_id)``; None: from the start), in key order; with ``upto``,
    only rows whose first value is at most ``upto``."""
    server = store.cluster.server_of_shard(topo, shard)
    table = quote(topo.dbs[shard], index.table)
    if topo.owned_db is not None:
        table += " FORCE INDEX (`by_shard`)"
    cols = [quote(c) for c in (*index.columns, "entity_id")]
    keys = ", ".join(cols)
    params: list[Any] = []
    where = "TRUE"
    if after is not None:
        ors = []
        for i, col in enumerate(cols):
            ands = [f"{c} = %s" for c in cols[:i]] + [f"{col} > %s"]
            ors.append("(" + " AND ".join(ands) + ")")
            params += [*after[:i], after[i]]
        where = " OR ".join(ors)
    if upto is not None:
        where = f"({where}) AND {cols[0]} <= %s"
        params.append(upto)
    # the primary key's order: a unique index's values alone (they are unique), so
    # the owned layout's ``by_shard`` (shard, primary key) reads it without a sort
    order = ", ".join(cols[:-1]) if index.unique else keys
    select = (
        f"SELECT {keys}, `entity_version` FROM {table} WHERE {shard_is(topo, shard)}({where})"
        f" ORDER BY {order} LIMIT {int(batch)}"
    )
    rows = server.run(guarded([select], topo.owned_db, [shard]), params)[0]
    return [(tuple(row[:-2]), bytes(row[-2]), int(row[-1])) for row in rows]
