"""The backfill of a counted index's counts (docs/architecture.md, "Counts"): once its
rows are backfilled, every live entity's keys for the index, added to the counters
where the entity does not hold them yet (a writer since the declaration added them),
guarded by the version read, a batch of entities per transaction."""

from __future__ import annotations

from schemaless.counts import backfill_sql, count_keys
from schemaless.errors import CorruptEntity, InvalidEntity
from schemaless.index import Index
from schemaless.store import DataStore

from .scan import entity_batches

__all__ = ["backfill_counts"]

_BATCH = 200  # entities per transaction: a few statements each, well below a packet


def backfill_counts(store: DataStore, index: Index) -> int:
    """Count every live entity of the datastore in ``index``'s counters; return how
    many entities had keys (each transaction is idempotent: a rerun adds nothing)."""
    topo = store.cluster.refresh()
    db = topo.owned_db
    assert db is not None  # a counted index is declared in the owned layout only
    created = topo.indexes[index.name].created
    seen = 0
    for shard in range(topo.n_shards):
        server = store.cluster.server_of_shard(topo, shard)
        for batch in entity_batches(store, topo, shard, batch=_BATCH):
            todo = []
            for _, key, version, body in batch:
                if body is None:
                    continue
                try:
                    rows = index.rows(store.decode(key, shard, version, body))
                except (InvalidEntity, CorruptEntity):
                    continue  # never indexed (set aside by the rows' backfill): no key
                keys = sorted(count_keys(index, created, rows))
                if keys:
                    todo.append((key, version, keys))
            if todo:
                seen += len(todo)
                server.run(*backfill_sql(db, shard, todo), commits=True)
    return seen
