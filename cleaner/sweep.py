"""The slow sweep: every index table, by primary key, in checkpointed rounds.

Each batch of index rows is checked against the entities they name, read afterwards
(tombstones included): rows the entity's current body does not produce are deleted
with the guard, absent entities are fenced first.  Checkpoint ``sweep:<index>`` per
shard: position = the round, cursor = the last primary key (msgpack).  A round ends
when every shard is done; the next pass starts the next round.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import msgpack

from schemaless import failpoints
from schemaless.catalog import Topology, sweep_job
from schemaless.index import Index

from .access import Found, read_entities
from .repair import Repairer
from .runtime import Runtime, ShardPending
from .scan import index_batch

__all__ = ["Sweep", "decode_cursor", "encode_cursor"]


def encode_cursor(key: tuple[Any, ...]) -> bytes:
    """A primary key ``(values..., entity_id)`` as checkpoint bytes."""
    return bytes(msgpack.packb(list(key), use_bin_type=True))


def decode_cursor(data: bytes) -> tuple[Any, ...]:
    """The primary key saved by ``encode_cursor``."""
    return tuple(msgpack.unpackb(data, raw=False))


class Sweep:
    """Sweeps index tables, each for at most a budget of rows per pass."""

    def __init__(self, rt: Runtime, repairer: Repairer) -> None:
        self.rt = rt
        self.repairer = repairer
        self.checked: dict[str, int] = {}  # rows swept by this process, per index

    def run(self, topo: Topology, indexes: Sequence[Index], budget: int | None) -> None:
        """Sweep each index: a whole fresh round if ``budget`` is None, else continue
        its current round (or start the next) for at most ``budget`` rows."""
        for index in indexes:
            if self.rt.stopping:
                return
            self._index(topo, index, budget)

    def _index(self, topo: Topology, index: Index, budget: int | None) -> int | None:
        rt = self.rt
        job = sweep_job(index.name)
        saved = rt.retry("reading checkpoints", partial(rt.store.cluster.catalog.cursors, job))
        current = max((p for p, _, _, _ in saved.values()), default=0)
        state = {
            s: (saved[s][1], saved[s][2], saved[s][3])
            if s in saved and saved[s][0] == current
            else (None, False, 0)
            for s in range(topo.n_shards)
        }
        if budget is None or current == 0 or all(done for _, done, _ in state.values()):
            current += 1
            state = {s: (None, False, 0) for s in range(topo.n_shards)}
        for shard, (cursor, done, rows) in state.items():
            if not done and rt.unavailable(shard):
                continue
            after = decode_cursor(cursor) if cursor is not None else None
            try:
                budget = self._shard(topo, index, shard, current, after, done, rows, budget)
            except ShardPending:
                continue  # a later pass finishes the round
            if rt.stopping or (budget is not None and budget <= 0):
                break
        return budget

    def _shard(
        self,
        topo: Topology,
        index: Index,
        shard: int,
        round_: int,
        after: tuple[Any, ...] | None,
        done: bool,
        rows: int,
        budget: int | None,
    ) -> int | None:
        """Sweep one shard of an index from ``after`` on; the budget left."""
        rt = self.rt
        while not done:
            if rt.stopping or (budget is not None and budget <= 0):
                return budget
            after, done, n = rt.retry(
                f"sweep of {index.name}, shard {shard}",
                partial(self._batch, index, shard, round_, after, rows),
                shard,
            )
            rows += n
            if budget is not None:
                budget -= n
            total = self.checked[index.name] = self.checked.get(index.name, 0) + n
            rt.progress.update(f"sweep {index.name}", total, None, shard + int(done), topo.n_shards)
            rt.tick()
        return budget

    def _batch(
        self,
        index: Index,
        shard: int,
        round_: int,
        after: tuple[Any, ...] | None,
        rows_before: int,
    ) -> tuple[tuple[Any, ...] | None, bool, int]:
        """One batch of rows after ``after``: (last key, shard done, rows read)."""
        rt = self.rt
        store = rt.store
        topo = store.cluster.current()  # a shard may have moved since the sweep began
        batch = index_batch(store, topo, shard, index, after, rt.batch)
        found = [Found(index, shard, values, key, version) for values, key, version in batch]
        down = rt.down
        # rows of entities on a server that is down: not checked in this round
        found = [r for r in found if not rt.on_down(topo, r.entity_id)]
        complete = len(found) == len(batch)
        if found:
            entities = read_entities(store, topo, {r.entity_id for r in found})
            failpoints.hit("cleaner.after_read")
            complete &= self.repairer.reconcile(
                topo, [index], entities, found, add_missing=False, skip=down
            )
        if not complete:
            rt.skipped(shard, "rows of entities on a server that is unavailable not checked")
        done = len(batch) < rt.batch
        last = (*batch[-1][0], batch[-1][1]) if batch else after
        store.cluster.catalog.save_cursor(
            sweep_job(index.name),
            shard,
            round_,
            encode_cursor(last) if last is not None else None,
            done,
            rows_before + len(batch),
        )
        rt.figures.add(rows_checked=len(batch))
        failpoints.hit("cleaner.after_batch")
        rt.throttle(len(batch))
        return last, done, len(batch)
