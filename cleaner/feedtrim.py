"""Trim the change feed: rows every subscription acknowledged, or older than the
retention, in batches (docs/architecture.md, "The change feed": why the Cleaner).

Per logical shard, the bound is the larger of the smallest acknowledged position (only
when some subscription has a position on that shard) and the last row older than the
retention; rows up to it are deleted oldest first.  A consumer behind the bound gets
``FeedExpired``.
"""

from __future__ import annotations

from typing import Any

from schemaless.catalog import Topology
from schemaless.errors import PermissionDenied
from schemaless.names import quote
from schemaless.owned import in_guarded_transaction
from schemaless.scatter import shard_is
from schemaless.subscriptions import acknowledged

from .purge import delete_in_batches
from .runtime import Runtime, ShardPending, log

__all__ = ["trim_feed"]


def trim_feed(rt: Runtime, topo: Topology, before_us: int) -> int:
    """Delete the feed's rows that no one needs on every shard; how many."""
    if not topo.changes:
        return 0
    acked = acknowledged(rt.store.cluster)
    total = 0
    for shard in range(topo.n_shards):
        if rt.unavailable(shard):
            continue
        floor = acked.get(shard) if acked is not None else None
        sql = _trim_sql(topo, shard, floor is not None, rt.batch)
        params: list[Any] = [before_us] if floor is None else [floor, before_us]
        try:
            total += delete_in_batches(rt, shard, "trimming the feed", sql, params, "feed_trimmed")
        except ShardPending:
            continue
        except PermissionDenied as exc:
            log.warning("change feed not trimmed: the cleaner user may not delete (%s)", exc)
            break
    return total


def _trim_sql(topo: Topology, shard: int, floor: bool, batch: int) -> str:
    """Delete up to ``batch`` of a shard's change rows up to the bound (the last row
    older than the retention, its parameter; with ``floor``, at least the smallest
    acknowledged position, the first parameter), one transaction; one result set:
    the rows deleted."""
    changes = quote(topo.dbs[shard], "changes")
    head = quote(topo.dbs[shard], "changes_head")
    on = shard_is(topo, shard)
    one = f"`shard` = {int(shard)}" if topo.owned_db is not None else "`one` = 1"
    # the last row older than the retention: the rows before the first newer one
    bound = (
        f"COALESCE((SELECT `seq` - 1 FROM {changes} WHERE {on}`at` >= %s ORDER BY `seq`"
        f" LIMIT 1), (SELECT `seq` FROM {head} WHERE {one}))"
    )
    if floor:
        bound = f"GREATEST(%s, {bound})"
    stmts = [
        f"SET @bound := {bound}",
        f"DELETE FROM {changes} WHERE {on}`seq` <= @bound ORDER BY `seq` LIMIT {int(batch)}",
        "SELECT ROW_COUNT()",
    ]
    return in_guarded_transaction(stmts, topo.owned_db, [shard])
