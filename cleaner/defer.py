"""A backfill's deferred rows: what it writes now, what it defers, and writing the
deferrals once their servers answer (docs/architecture.md, "Deferred rows").

``Redo`` runs, each round, the deferrals of the backfill's part (by source shard)
whose source and target servers both answered the round's ``SELECT 1``: one lane per
source server, a source shard at a time.  The union of a source shard's deferred
ranges is read again once, batch by batch, only the rows for their targets are written
(upserted, proven, what changed reconciled, as a batch of the scan), and each deferral
is forgotten unless it was widened meanwhile.  A source shard whose servers fail again
waits ``patience``, then is left for the next round (reported pending).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from schemaless import failpoints
from schemaless.catalog import Topology
from schemaless.deferrals import Deferral, Deferrals
from schemaless.index import Index

from .batch import Derived
from .runtime import Runtime, ShardPending, Stopped, log
from .scan import EntityRow

__all__ = ["Redo", "on", "only", "ready"]

#: ``read(shard, after)``: the batch of a logical shard after an ``added_id``.
Read = Callable[[int, int], list[EntityRow]]
#: ``derive(index, shard, rows)``: a batch's index rows.
Derive = Callable[[Index, int, list[EntityRow]], Derived]
#: ``put(topo, index, shard, after, rows, derived)``: upsert, prove, reconcile;
#: whether no row was left out (none is sent to a server that is down).
Put = Callable[[Topology, Index, int, int, list[EntityRow], Derived], bool]
#: Runs jobs at once, each given a pool for its reads ahead.
Parallel = Callable[[list[Callable[[ThreadPoolExecutor], None]]], None]


def only(derived: Derived, keep: Callable[[int], bool]) -> Derived:
    """The rows of ``derived`` for the logical shards ``keep`` accepts (no set-asides)."""
    targets = {t: rows for t, rows in derived.targets.items() if keep(t)}
    return Derived(targets, sum(len(rows) for rows in targets.values()))


def on(topo: Topology, servers: Container[int]) -> list[int]:
    """The logical shards that live on these servers (ids)."""
    return [s for s, sid in enumerate(topo.shard_servers) if sid in servers]


def ready(deferrals: Iterable[Deferral], topo: Topology, down: Container[int]) -> list[Deferral]:
    """The deferrals whose source and target servers are not ``down`` (server ids)."""
    on = topo.shard_servers
    return [d for d in deferrals if on[d.source] not in down and on[d.target] not in down]


class Redo:
    """Writes one backfill's (one part's) deferrals; ``left``: those left after the
    last round."""

    def __init__(
        self,
        rt: Runtime,
        name: str,
        part: tuple[int, int],
        read: Read,
        derive: Derive,
        put: Put,
    ) -> None:
        self.rt, self.name, self.part = rt, name, part
        self.read, self.derive, self.put = read, derive, put
        self.deferrals = Deferrals(rt.store.cluster.catalog)
        self.left: list[Deferral] = []

    def run(self, topo: Topology, index: Index, parallel: Parallel) -> None:
        """Write the deferrals whose servers answer, one lane per source server."""
        lanes: dict[int, list[Deferral]] = {}
        for d in ready(self._mine(), topo, self.rt.down):
            lanes.setdefault(topo.shard_servers[d.source], []).append(d)
        if lanes:
            parallel([partial(self._lane, index=index, ds=ds) for ds in lanes.values()])
        self.left = self._mine()
        self.rt.figures.set(deferrals=len(self.left))

    def warn(self, topo: Topology, delay: float) -> None:
        """Log the deferrals left, by target shard and server."""
        if not self.left:
            return
        targets = sorted({d.target for d in self.left})
        servers = topo.addresses_of(targets)
        log.warning(
            "index %r: rows for logical shard(s) %s (on %s) deferred; the index stays "
            "building; writing them when the server answers (next try in %.3gs)",
            self.name,
            ", ".join(map(str, targets)),
            ", ".join(servers),
            delay,
        )

    def _mine(self) -> list[Deferral]:
        k, n = self.part
        found = self.rt.retry("reading deferrals", lambda: self.deferrals.of(self.name))
        return [d for d in found if d.source % n == k]

    def _lane(self, pool: ThreadPoolExecutor, *, index: Index, ds: list[Deferral]) -> None:
        """The deferrals of one source server, a source shard at a time."""
        by_source: dict[int, list[Deferral]] = {}
        for d in ds:
            by_source.setdefault(d.source, []).append(d)
        for source, mine in sorted(by_source.items()):
            if self.rt.stopping:
                return
            try:
                self._redo(index, source, mine)
            except ShardPending:
                continue
            except Stopped:
                return

    def _redo(self, index: Index, source: int, ds: list[Deferral]) -> None:
        """Write the rows of a source shard's deferrals: the union of their ranges read
        once, batch by batch, the rows for their targets written (a row written for a
        target outside its own deferral's range is a correct row, written again);
        then forget each deferral."""
        targets = {d.target for d in ds}
        what = f"backfill {self.name} shard {source} (rows deferred for {sorted(targets)})"
        after, upto = min(d.after for d in ds), max(d.upto for d in ds)
        while after < upto:
            if self.rt.stopping:
                raise Stopped()
            step = partial(self._batch, index, source, targets, after, upto)
            after = self.rt.retry(what, step, source)
        for d in ds:
            if not self.rt.retry(
                "forgetting a deferral", partial(self.deferrals.finish, d), source
            ):
                log.info("%s: widened meanwhile; the next round writes it again", what)

    def _batch(self, index: Index, source: int, targets: set[int], after: int, upto: int) -> int:
        """One batch of a source shard's deferred range: its rows for ``targets``
        written; where the next batch starts (``upto``: none left)."""
        batch = self.read(source, after)
        rows = [row for row in batch if row[0] <= upto]
        if not rows:
            return upto
        topo = self.rt.store.cluster.current()
        down = set(self.rt.down)
        mine = only(self.derive(index, source, rows), targets.__contains__)
        if not self.put(topo, index, source, after, rows, mine):  # rows left out: deferred
            left = [Deferral(self.name, source, t, after, rows[-1][0]) for t in on(topo, down)]
            self.deferrals.add(left)
        self.rt.throttle(len(rows))
        self.rt.figures.add(rows_backfilled=mine.rows, rows_checked=len(rows))
        failpoints.hit("cleaner.after_redo")
        return rows[-1][0] if len(rows) == len(batch) == self.rt.batch else upto
