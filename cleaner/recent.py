"""The recent-first pass: entities changed since the last pass, by ``KEY(updated)``.

For each logical shard, the entity rows (tombstones included) whose ``updated`` is
above the shard's high-water mark (job ``recent``) minus a small overlap (a write
commits a little after the time it stamps) are compared with the rows that exist
for them in every maintained index; extra rows are deleted with the guard, missing
or behind ones upserted.  With no mark yet, the pass starts ``window`` seconds back.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from schemaless import failpoints
from schemaless.catalog import Topology
from schemaless.index import Index
from schemaless.results import scalar
from schemaless.scatter import unreachable_only

from .access import Stored, read_rows
from .repair import Repairer
from .runtime import Runtime, ShardPending
from .sql import backlog_sql, recent_batch_sql

__all__ = ["JOB", "RecentPass"]

JOB = "recent"


class RecentPass:
    """Checks recently changed entities, shard by shard, checkpointing the mark."""

    def __init__(
        self, rt: Runtime, repairer: Repairer, *, overlap: float = 5.0, window: float = 3600.0
    ) -> None:
        self.rt = rt
        self.repairer = repairer
        self.overlap_us = int(overlap * 1e6)
        self.window_us = int(window * 1e6)
        self.checked = 0  # entities checked by this process, for the progress display

    def marks(self, topo: Topology, now_us: int) -> dict[int, int]:
        """Each shard's high-water mark (µs)."""
        catalog = self.rt.store.cluster.catalog
        saved = self.rt.retry("reading checkpoints", partial(catalog.checkpoints, JOB))
        default = max(0, now_us - self.window_us)
        return {s: saved[s][0] if s in saved else default for s in range(topo.n_shards)}

    def backlog(self, marks: dict[int, int]) -> int:
        """Entity rows changed after the marks (one statement per server; a server
        that is unavailable is left out: its shards' work is pending)."""
        cluster = self.rt.store.cluster
        topo = cluster.current()
        groups = {sid: {s: marks[s] for s in topo.shards_of(sid)} for sid in topo.servers}
        found = cluster.scatter(
            topo,
            {sid: mine for sid, mine in groups.items() if mine},
            lambda mine: backlog_sql(topo.dbs, topo.owned_db, mine),
            partial=True,
        )
        unreachable_only(found.errors)
        return sum(int(scalar(rows[0])) for rows in found.results.values())

    def run(self, topo: Topology, indexes: Sequence[Index], now_us: int) -> int:
        """One pass over every shard (a shard whose server is unavailable is left
        pending); the number of entities checked."""
        marks = self.marks(topo, now_us)
        backlog = self.rt.retry("counting the backlog", partial(self.backlog, marks))
        self.rt.figures.set(backlog=backlog)
        if not indexes:
            return 0
        checked = 0
        for shard in range(topo.n_shards):
            if self.rt.stopping:
                break
            if self.rt.unavailable(shard):
                continue
            try:
                checked += self._shard(topo, indexes, shard, marks[shard])
            except ShardPending:
                continue
        return checked

    def _shard(self, topo: Topology, indexes: Sequence[Index], shard: int, mark: int) -> int:
        """One shard's changes after its mark; the number of entities checked.  Rows on
        a server that is down are not read (the sweep of its shards finds its orphans
        once it is back); if a row had to be upserted there, the mark stays and the
        shard is left pending."""
        checked = 0
        position: tuple[int, int] | None = (max(0, mark - self.overlap_us), 0)
        save = True  # until a batch leaves out an upsert: then the mark stays
        while position is not None and not self.rt.stopping:
            position, n, complete = self.rt.retry(
                f"recent pass, shard {shard}",
                partial(self._batch, indexes, shard, position, mark, save),
                shard,
            )
            if not complete:
                save = False
                self.rt.skipped(shard, "index rows to write on a server that is unavailable")
            checked += n
            self.checked += n
            self.rt.progress.update("recent", self.checked, None, shard, topo.n_shards)
            self.rt.tick()
        return checked

    def _batch(
        self,
        indexes: Sequence[Index],
        shard: int,
        after: tuple[int, int],
        mark: int,
        save: bool,
    ) -> tuple[tuple[int, int] | None, int, bool]:
        """One batch after ``(updated, added_id)``: the next position (None: done), the
        rows read, whether no upsert was left out (then, and if ``save``, the mark is
        saved)."""
        rt = self.rt
        topo = rt.store.cluster.current()  # a shard may have moved since the pass began
        server = rt.store.cluster.server_of_shard(topo, shard)
        sql, params = recent_batch_sql(topo.dbs, topo.owned_db, shard, after[0], after[1], rt.batch)
        rows = server.run(sql, params)[0]
        if not rows:
            return None, 0, True
        entities = {
            bytes(key): Stored(bytes(key), shard, int(version), bytes(b) if b is not None else None)
            for _, key, version, _, b in rows
        }
        down = rt.down
        found = read_rows(rt.store, topo, indexes, entities, down) if indexes else []
        failpoints.hit("cleaner.after_read")
        complete = self.repairer.reconcile(
            topo, indexes, entities, found, add_missing=True, skip=down
        )
        last_updated, last_added = int(rows[-1][3]), int(rows[-1][0])
        if save and complete:
            rt.store.cluster.catalog.save_checkpoint(JOB, shard, max(mark, last_updated), False, 0)
        rt.figures.add(rows_checked=len(rows) + len(found))
        failpoints.hit("cleaner.after_batch")
        rt.throttle(len(rows) + len(found))
        done = len(rows) < rt.batch
        return (None if done else (last_updated, last_added)), len(rows), complete
