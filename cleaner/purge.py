"""Purge tombstones older than the retention period, in batches.

A tombstone keeps a deleted entity's version so later writes go above it; after the
retention no operation that saw the old version can still be in flight.  If orphan
rows of a purged id remain, the sweep fences the id again before deleting them.

Purging needs DELETE on ``entities``, which the Cleaner's least-privilege grant
(schemaless.grants) does not give: then the purge is skipped, with one warning per
process and the figure ``purge_skipped``, and the pass carries on.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from schemaless.catalog import Topology
from schemaless.connection import Rows
from schemaless.errors import PermissionDenied
from schemaless.results import scalar

from .runtime import Runtime, ShardPending, log
from .sql import purge_sql

__all__ = ["delete_in_batches", "purge_tombstones"]


def purge_tombstones(rt: Runtime, topo: Topology, before_us: int) -> int:
    """Delete tombstones last written before ``before_us`` on every shard; how many."""
    total = 0
    for shard in range(topo.n_shards):
        if rt.unavailable(shard):
            continue
        sql, params = purge_sql(topo.dbs, topo.owned_db, shard, before_us, rt.batch)
        try:
            total += delete_in_batches(rt, shard, "purging tombstones", sql, params, "purged")
        except ShardPending:
            continue
        except PermissionDenied as exc:
            _skipped(rt, exc)
            break
    return total


def delete_in_batches(
    rt: Runtime, shard: int, what: str, sql: str, params: list[Any], figure: str
) -> int:
    """Run a batch delete on the shard's server (its one result set: ROW_COUNT()),
    again while a batch deletes ``rt.batch`` rows, paced; how many (figure ``figure``).
    PermissionDenied if the user may not delete, ShardPending if the shard's server
    stays unavailable."""
    total = 0
    while not rt.stopping:
        out = rt.retry(f"{what}, shard {shard}", partial(_on_shard, rt, shard, sql, params), shard)
        n = int(scalar(out[0]))
        total += n
        rt.figures.add(**{figure: n})
        rt.tick()
        if n < rt.batch:
            break
        rt.throttle(n)
    return total


def _on_shard(rt: Runtime, shard: int, sql: str, params: list[Any]) -> Rows:
    """One batch, on the server that holds the shard now."""
    cluster = rt.store.cluster
    return cluster.server_of_shard(cluster.current(), shard).run(sql, params)


def _skipped(rt: Runtime, exc: PermissionDenied) -> None:
    """The user may not delete entities: say so once, count every skipped purge."""
    first = rt.figures.as_dict()["purge_skipped"] == 0
    rt.figures.add(purge_skipped=1)
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "tombstone purge skipped: the cleaner user may not delete entities; run "
        "`cleaner --once` as the admin user, or grant DELETE (%s)",
        exc,
    )
