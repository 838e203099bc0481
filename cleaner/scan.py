"""Reading whole logical shards in ``added_id`` order, and index tables by key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from schemaless.catalog import Topology
from schemaless.index import Index
from schemaless.names import quote
from schemaless.schema import shard_db
from schemaless.store import DataStore

__all__ = ["EntityRow", "entity_batches", "index_batch", "index_rows"]

#: (added_id, id, version, body or None for a tombstone)
EntityRow = tuple[int, bytes, int, bytes | None]


def entity_batches(
    store: DataStore, topo: Topology, shard: int, after: int = 0, batch: int = 1000
) -> Iterator[list[EntityRow]]:
    """Every entity row of a shard with ``added_id > after``, in batches."""
    server = store.cluster.server_of_shard(topo, shard)
    table = quote(shard_db(topo.prefix, shard), "entities")
    while True:
        rows = server.run(
            f"SELECT `added_id`, `id`, `version`, `body` FROM {table}"
            " WHERE `added_id` > %s ORDER BY `added_id` LIMIT %s",
            (after, batch),
        )[0]
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
    table = quote(shard_db(topo.prefix, shard), index.table)
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
    rows = server.run(
        f"SELECT {keys}, `entity_version` FROM {table} WHERE {where}"
        f" ORDER BY {keys} LIMIT {int(batch)}",
        params,
    )[0]
    return [(tuple(row[:-2]), bytes(row[-2]), int(row[-1])) for row in rows]
