"""Expiry: delete the entities whose expiry time has passed, guarded by version.

Candidates come from a ready index whose first property is the datastore's expiry
property, typed int or float (its rows up to now, in key order) or, without one, from
a scan of every logical shard by ``added_id`` (a slice per pass, like the sweep).
Each candidate is read raw, decoded, and if it has expired on the Cleaner's clock it
is deleted through the datastore's own delete with ``expect_version`` = the version
read: a writer that re-put the entity since moved the version on, so the delete
conflicts and the new entity stays (``expired_kept``).  Batches are paid to the
throttle like the rest of the Cleaner's work.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from schemaless import failpoints
from schemaless.catalog import IndexState, Topology
from schemaless.errors import ConflictError, CorruptEntity, PermissionDenied
from schemaless.expiry import expired
from schemaless.index import Index
from schemaless.names import quote
from schemaless.scatter import shard_is, shard_unions, unreachable_only

from .access import read_entities
from .runtime import Runtime, ShardPending, log
from .scan import entity_batches, index_batch

__all__ = ["Expiry", "expiry_index"]

_NUMERIC = ("int", "float")


def expiry_index(topo: Topology, prop: str) -> Index | None:
    """A ready index that leads with the expiry property as a number, if any (not a
    partial one: it holds the rows of some entities only)."""
    for name in sorted(topo.indexes):
        info = topo.indexes[name]
        index = info.index
        if (
            info.state == IndexState.READY
            and index.properties[0] == prop
            and index.types[0].name in _NUMERIC
            and index.multi is None
            and not index.filter
        ):
            return index
    return None


class Expiry:
    """Finds and deletes expired entities, pass after pass."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._at = (0, 0)  # the scan's position between passes: (logical shard, added_id)

    def run(self, topo: Topology, now: float, budget: int | None) -> None:
        """Delete what expired at ``now`` (epoch seconds): every candidate of the index,
        else the scan's next ``budget`` entity rows (None: every shard, from the start)."""
        prop = topo.expire_on
        if prop is None:
            return
        index = expiry_index(topo, prop)
        try:
            if index is not None:
                self._by_index(topo, index, now)
            else:
                self._scan(topo, now, budget)
        except PermissionDenied as exc:
            self.rt.figures.add(expire_skipped=1)
            log.warning(
                "expiry skipped: the cleaner user may not write tombstones; re-run "
                "`schemaless grants cleaner` since the datastore has an expiry property (%s)",
                exc,
            )

    # -- by index ------------------------------------------------------------------------

    def _by_index(self, topo: Topology, index: Index, now: float) -> None:
        rt = self.rt
        pending = rt.retry("counting expired index rows", partial(_count, rt, index, now))
        rt.figures.set(expired_pending=pending)  # an estimate: stale rows count too
        for shard in range(topo.n_shards):
            after: tuple[Any, ...] | None = None
            while not (rt.stopping or rt.unavailable(shard)):
                try:
                    after, n = rt.retry(
                        f"expiry by {index.name}, shard {shard}",
                        partial(self._index_batch, index, shard, after, now),
                        shard,
                    )
                except ShardPending:
                    break
                rt.tick()
                if n < rt.batch:
                    break

    def _index_batch(
        self, index: Index, shard: int, after: tuple[Any, ...] | None, now: float
    ) -> tuple[tuple[Any, ...] | None, int]:
        """One batch of index rows up to ``now``: (the last key, rows read)."""
        store = self.rt.store
        topo = store.cluster.current()
        rows = index_batch(store, topo, shard, index, after, self.rt.batch, upto=now)
        if not rows:
            return after, 0
        ids = {key for _, key, _ in rows if not self.rt.on_down(topo, key)}
        if len(ids) < len({key for _, key, _ in rows}):
            self.rt.skipped(shard, "entities on a server that is unavailable not expired")
        stored = read_entities(store, topo, ids)
        seen = [(s.id, s.shard, s.version, s.body) for s in stored.values()]
        self._purge(self._expired(seen, now), counted=True)
        self.rt.throttle(len(rows))
        return (*rows[-1][0], rows[-1][1]), len(rows)

    # -- by scan -------------------------------------------------------------------------

    def _scan(self, topo: Topology, now: float, budget: int | None) -> None:
        rt = self.rt
        shard, after = self._at if budget is not None else (0, 0)
        if shard >= topo.n_shards:
            shard, after = 0, 0
        rt.figures.set(expired_pending=0)
        while shard < topo.n_shards and not rt.stopping:
            if budget is not None and budget <= 0:
                break
            if rt.unavailable(shard):
                shard, after = shard + 1, 0  # the scan's next round comes back to it
                continue
            try:
                after, n = rt.retry(
                    f"expiry scan, shard {shard}",
                    partial(self._scan_batch, shard, after, now),
                    shard,
                )
            except ShardPending:
                shard, after = shard + 1, 0  # the scan's next round comes back to it
                continue
            rt.tick()
            if budget is not None:
                budget -= n
            if n < rt.batch:
                shard, after = shard + 1, 0
        self._at = (shard, after) if shard < topo.n_shards else (0, 0)

    def _scan_batch(self, shard: int, after: int, now: float) -> tuple[int, int]:
        """One batch of a shard's entity rows after ``after``: (last added_id, rows)."""
        store = self.rt.store
        topo = store.cluster.current()
        rows = next(entity_batches(store, topo, shard, after, self.rt.batch), [])
        if not rows:
            return after, 0
        seen = [(bytes(key), shard, int(version), body) for _, key, version, body in rows]
        self._purge(self._expired(seen, now), counted=False)
        self.rt.throttle(len(rows))
        return int(rows[-1][0]), len(rows)

    # -- both ----------------------------------------------------------------------------

    def _expired(
        self, rows: list[tuple[bytes, int, int, bytes | None]], now: float
    ) -> list[tuple[bytes, int]]:
        """(id, version) of the rows whose body has expired at ``now``."""
        store = self.rt.store
        prop = store.cluster.topology.expire_on
        out = []
        for key, shard, version, body in rows:
            if body is None:
                continue  # a tombstone
            try:
                entity = store.decode(key, shard, version, body)
            except CorruptEntity as exc:
                self.rt.figures.add(corrupt=1)
                log.error("expiry: %s", exc)
                continue
            if expired(entity, prop, now):
                out.append((key, version))
        return out

    def _purge(self, candidates: list[tuple[bytes, int]], *, counted: bool) -> None:
        """Delete each candidate if it is still at the version seen expired (a re-put
        moved it on: it stays).  ``counted``: already in ``expired_pending``."""
        if not candidates:
            return
        figures = self.rt.figures
        if not counted:
            figures.add(expired_pending=len(candidates))
        failpoints.hit("cleaner.expire.before_delete")
        for key, version in candidates:
            try:
                self.rt.store.delete(key, expect_version=version)
                figures.add(expired_purged=1, expired_pending=-1)
            except ConflictError:
                figures.add(expired_kept=1, expired_pending=-1)
        self.rt.throttle(len(candidates))


def _count(rt: Runtime, index: Index, now: float) -> int:
    """Index rows up to ``now`` on every shard: one statement per server (a server
    that is unavailable is left out: its shards' work is pending)."""
    cluster = rt.store.cluster
    topo = cluster.current()
    col = quote(index.columns[0])
    unions = shard_unions(
        topo,
        lambda s: (
            f"(SELECT COUNT(*) FROM {quote(topo.dbs[s], index.table)}"
            f" WHERE {shard_is(topo, s)}{col} <= %s)"
        ),
    )
    # one parameter per part (names are validated identifiers: no "%s" in them)
    found = cluster.scatter(topo, unions, lambda sql: (sql, [now] * sql.count("%s")), partial=True)
    unreachable_only(found.errors)
    return sum(int(r[0]) for rows in found.results.values() for r in rows[0])
