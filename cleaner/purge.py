"""Purge tombstones older than the retention period, in batches.

A tombstone keeps a deleted entity's version so later writes go above it; after the
retention no operation that saw the old version can still be in flight.  If orphan
rows of a purged id remain, the sweep fences the id again before deleting them.
"""

from __future__ import annotations

from functools import partial

from schemaless.catalog import Topology

from .runtime import Runtime
from .sql import purge_sql

__all__ = ["purge_tombstones"]


def purge_tombstones(rt: Runtime, topo: Topology, before_us: int) -> int:
    """Delete tombstones last written before ``before_us`` on every shard; how many."""
    total = 0
    for shard in range(topo.n_shards):
        server = rt.store.cluster.server_of_shard(topo, shard)
        sql, params = purge_sql(topo.prefix, shard, before_us, rt.batch)
        while not rt.stopping:
            out = rt.retry(f"purging tombstones, shard {shard}", partial(server.run, sql, params))
            n = int(out[0][0][0])
            total += n
            rt.figures.add(purged=n)
            rt.tick()
            if n < rt.batch:
                break
            rt.throttle(n)
    return total
