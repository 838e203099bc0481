"""Backfill a ``building`` index, then mark it ``ready``.

After the grace period (every writer maintains the index by then, and no fence of an
older index epoch is left, so no writer without it can still commit), each logical
shard's entities are read by ``added_id`` in batches; their rows are upserted with the
entity's version (``GREATEST``), grouped per server, servers in parallel; then the
batch's versions are proven unchanged (or read again, and the rows upserted for
entities that a writer changed meanwhile are reconciled), so the backfill leaves no
stale row of its own.  Each shard's checkpoint
``(backfill:<index>, shard) -> last added_id`` is saved after its batch committed; a
restart resumes there.  One lane per server runs its shards, each shard as a
pipeline: while a batch is written, proven and checkpointed (batches in order), the
next one is derived and the one after it read.  A lane checks its server's fences
first; if its server stays unavailable (``Runtime.patience``), its unfinished shards
are left pending while the other lanes go on.  A batch's rows for logical shards whose
server is ``down`` are deferred (``schemaless.deferrals``, recorded with the
checkpoint; ``defer.Redo`` writes them once the server answers).  Rounds after a pause
take up the pending shards and the deferrals until none is left.  Then ``KEY
by_entity`` is built on the index's tables (a declaration creates them without it),
then the index is marked ready, unless entities were set aside because their values do
not fit it (``save_unfit``) or writes met it with such values (``Catalog.block_index``):
then it stays building (docs/architecture.md, "Declaring an index over data that does
not fit"), and the next backfill forgets those marks under a new index epoch
(``reopen``) and scans every shard again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import Any

from schemaless import failpoints
from schemaless.catalog import IndexInfo, IndexState, Topology, backfill_job
from schemaless.deferrals import Deferral
from schemaless.errors import (
    CatalogError,
    IndexDefinitionError,
    PermissionDenied,
    SchemalessError,
)
from schemaless.expiry import expired
from schemaless.ids import id_hex
from schemaless.index import Index
from schemaless.scatter import by_server
from schemaless.store import DataStore
from schemaless.unique import Violation

from .access import read_entities, read_own, upsert_grouped, versions_proof
from .batch import Derived, Placement, derive, proof
from .counted import backfill_counts
from .defer import Redo, on, only
from .estimate import Span, added_ranges
from .repair import Repairer
from .runtime import Runtime, ShardPending, Stopped, log
from .scan import EntityRow, entity_batches
from .sql import entity_versions_sql
from .throttle import backoff_delays

__all__ = ["Backfill", "grace_deadline", "reopen"]

_EXAMPLES = 5  # entities set aside, kept per logical shard
_REOPEN_ATTEMPTS = 5  # declarations racing a reopen for the next index epoch


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    """Values for the catalog's JSON: bytes as ``0x...`` hex."""
    return {k: "0x" + v.hex() if isinstance(v, bytes) else v for k, v in values.items()}


def _unexpired(
    store: DataStore, shard: int, rows: list[EntityRow], found: list[Violation]
) -> list[Violation]:
    """The violations of entities (of this shard's batch) that have not expired: an
    expired entity holds no unique value, so it duplicates none."""
    prop = store.cluster.topology.expire_on
    if prop is None or not found:
        return found
    now = time.time()
    stored = {key: (version, body) for _, key, version, body in rows if body is not None}
    out = []
    for v in found:
        got = stored.get(v.row.entity_id)
        if got is None or not expired(store.decode(v.row.entity_id, shard, *got), prop, now):
            out.append(v)
    return out


def grace_deadline(info: IndexInfo, topo: Topology) -> float:
    """When every writer maintains the index: its state change plus two catalog
    refresh intervals plus one second (Unix seconds, on the catalog server's clock)."""
    return info.changed / 1e6 + 2 * topo.refresh_interval + 1.0


def reopen(rt: Runtime, name: str) -> bool:
    """If writes or a backfill recorded values that building index ``name`` cannot
    hold, forget them and its checkpoints under a new index epoch (a write in flight
    that met the index commits before the old fences are dropped, so the scan that
    follows sees it, or writes again and blocks the index anew); whether it did."""
    cluster = rt.store.cluster
    catalog = cluster.catalog
    writes, unfit = rt.retry("reading what blocks the index", lambda: catalog.blocks(name))
    if not writes[0] and not unfit:
        return False
    try:
        for _ in range(_REOPEN_ATTEMPTS):
            if rt.retry("reopening the index", partial(_next_epoch, rt, name)):
                break
        else:
            raise CatalogError(f"index {name!r}: declarations kept racing the rescan; try again")
    except PermissionDenied:
        log.warning(
            "index %r is blocked (see `schemaless index status %s`): forgetting the blocks "
            "takes a new index epoch, which this user may not create; once the data is "
            "fixed, run this backfill as a user that may create tables (the admin)",
            name,
            name,
        )
        return False
    now = rt.retry("reading the catalog", cluster.refresh)
    rt.retry("dropping old fences", lambda: cluster.retire_fences(now))
    log.info(
        "index %r: %d write(s) and %d set-aside entities blocked it; scanning every shard again",
        name,
        writes[0],
        sum(count for count, _ in unfit.values()),
    )
    return True


def _next_epoch(rt: Runtime, name: str) -> bool:
    """``reopen_index`` from the current index epoch, its successor's fences first."""
    cluster = rt.store.cluster
    topo = cluster.refresh()
    cluster.create_fences(topo, topo.index_epoch + 1)
    return cluster.catalog.reopen_index(name, topo.index_epoch)


_UNMEASURED = Span(0, 0, 1.0)  # a shard on a server unavailable when measured: none left


@dataclass
class _Shard:
    shard: int
    position: int
    done: bool
    rows: int
    span: Span = _UNMEASURED  # its added_id range when measured: for the estimate


class _Pacer:
    """Pays the throttle for a batch of ``rows`` entity rows in proportion to the index
    rows sent (of ``total``), then the rest."""

    def __init__(self, rt: Runtime, rows: int, total: int) -> None:
        self.rt, self.rows, self.total = rt, rows, total
        self.sent = self.paid = 0

    def __call__(self, sent: int) -> None:
        self.sent += sent
        due = min(self.rows, self.rows * self.sent // max(1, self.total))
        self.rt.throttle(due - self.paid)
        self.paid = max(self.paid, due)

    def rest(self) -> None:
        self.rt.throttle(self.rows - self.paid)
        self.paid = self.rows


class Backfill:
    """One index's backfill; ``run()`` returns the index state at the end."""

    def __init__(
        self, rt: Runtime, repairer: Repairer, name: str, part: tuple[int, int] = (0, 1)
    ) -> None:
        self.rt = rt
        self.repairer = repairer
        self.name = name
        self.part = part  # (k, n): this process runs the logical shards with shard % n == k
        self.job = backfill_job(name)
        self.redo = Redo(rt, name, part, self._read, self._derive, self._put)
        self._shards: dict[int, _Shard] = {}
        self.seconds = 0.0  # time spent scanning (after the grace period)
        self._started: float | None = None
        self._lock = threading.Lock()
        self._place: Placement | None = None
        self._found: dict[int, list[dict[str, Any]]] = {}  # duplicates shown, per shard
        self._counts: dict[int, int] = {}  # duplicates found, per shard
        self._unfit: dict[int, tuple[int, list[dict[str, Any]]]] = {}  # set aside, per shard
        self.duplicates_left = False
        self.blocked = False  # values it cannot hold were found: it stays building

    # -- the whole job -------------------------------------------------------------------

    def run(self) -> IndexState:
        """Backfill until every shard is done (then ``ready``) or a stop is requested."""
        rt = self.rt
        cluster = rt.store.cluster
        topo = rt.retry("reading the catalog", cluster.refresh)
        info = topo.indexes.get(self.name)
        if info is None:
            known = ", ".join(sorted(topo.indexes)) or "none"
            raise IndexDefinitionError(f"no index named {self.name!r} (indexes: {known})")
        if info.state == IndexState.READY:
            log.info("index %r is already ready: nothing to backfill", self.name)
            return IndexState.READY
        if info.state != IndexState.BUILDING:
            raise CatalogError(
                f"index {self.name!r} is {info.state}: only a building index can be backfilled"
            )
        if self.part[1] == 1:  # parts: ``cleaner --jobs`` reopens before it starts them
            reopen(rt, self.name)
        self._wait_grace(info, topo)
        topo = rt.retry("reading the catalog", cluster.refresh)
        k, n = self.part
        if info.index.unique:
            self._rescan_duplicates(topo)
        saved = rt.retry("reading checkpoints", lambda: cluster.catalog.checkpoints(self.job))
        for shard in range(k, topo.n_shards, n):
            position, done, rows = saved.get(shard, (0, False, 0))
            self._shards[shard] = _Shard(shard, position, done, rows)
        rt.retry("measuring shards", self._measure)
        rt.figures.set(state="backfilling")
        self._report(force=True)
        self._started = started = time.monotonic()
        try:
            self._run_rounds(topo, info.index)
        finally:
            self.seconds = time.monotonic() - started
            self._report(force=True)
        if not all(s.done for s in self._shards.values()) or self.redo.left:
            return IndexState.BUILDING
        if self.part[1] > 1 and not self._all_parts_done(topo):
            log.info("index %r: part %d/%d done; other parts still running", self.name, k + 1, n)
            return IndexState.BUILDING
        self._check_fences(rt.retry("reading the catalog", cluster.refresh))
        if info.index.unique and self._duplicates_left():
            self.duplicates_left = True
            return IndexState.BUILDING
        rt.figures.set(state="building the by_entity key")
        rest = rt.rest if rt.throttler is not None else None  # throttled: one table at a time
        add = partial(cluster.add_entity_keys, index=info.index, rest=rest)
        rt.retry("building the by_entity key", lambda: add(cluster.current()))
        failpoints.hit("cleaner.after_entity_key")
        if info.index.counted:
            rt.figures.set(state="counting")
            rt.retry("counting", lambda: backfill_counts(rt.store, info.index))
        if rt.retry("marking ready", lambda: cluster.catalog.set_ready(self.name)):
            log.info("index %r backfilled: now ready", self.name)
            return IndexState.READY
        return self._not_ready()

    def _not_ready(self) -> IndexState:
        """The state of an index that the ready transition did not change (logged)."""
        cluster = self.rt.store.cluster
        state = self.rt.retry("reading the catalog", cluster.refresh).indexes[self.name].state
        if state == IndexState.BUILDING:
            self.blocked = True
            log.error(
                "index %r: values that it cannot hold were found (see `schemaless index "
                "status %s`); it stays building: fix them and run the backfill again, or "
                "drop it",
                self.name,
                self.name,
            )
        else:
            log.warning("index %r was %s when the backfill ended", self.name, state)
        return state

    @property
    def part_done(self) -> bool:
        """Whether every logical shard of this process's part is backfilled (and, for a
        unique index, no duplicate was left)."""
        done = bool(self._shards) and all(s.done for s in self._shards.values())
        return done and not self.redo.left and not self.duplicates_left

    def _all_parts_done(self, topo: Topology) -> bool:
        """Whether the checkpoints say every logical shard is done and no deferral is
        left (all parts)."""
        catalog = self.rt.store.cluster.catalog
        saved = self.rt.retry("reading checkpoints", lambda: catalog.checkpoints(self.job))
        left = self.rt.retry("reading deferrals", lambda: self.redo.deferrals.of(self.name))
        done = all(saved.get(shard, (0, False, 0))[1] for shard in range(topo.n_shards))
        return done and not left

    def _rescan_duplicates(self, topo: Topology) -> None:
        """The logical shards of this part where an earlier run found duplicates are
        scanned again (the user may have resolved them)."""
        catalog = self.rt.store.cluster.catalog
        found = self.rt.retry("reading duplicates", lambda: catalog.duplicates(self.name))
        k, n = self.part
        again = [shard for shard in found if shard % n == k and shard < topo.n_shards]
        if again:
            log.info("index %r: scanning %d shard(s) with duplicates again", self.name, len(again))
            self.rt.retry("forgetting duplicates", lambda: catalog.rescan(self.name, again))

    def _duplicates_left(self) -> bool:
        """Whether any logical shard recorded duplicates (logged): the index stays
        building, as PostgreSQL leaves an invalid unique index."""
        catalog = self.rt.store.cluster.catalog
        found = self.rt.retry("reading duplicates", lambda: catalog.duplicates(self.name))
        total = sum(count for count, _ in found.values())
        if total:
            log.error(
                "unique index %r: %d duplicate value(s) (see `schemaless index status %s`);"
                " it stays building: resolve them and run the backfill again",
                self.name,
                total,
                self.name,
            )
        return total > 0

    def _check_fences(self, topo: Topology, shard: int | None = None) -> None:
        """Refuse while a fence of an older index epoch remains: a writer whose map
        lacks this index could still commit (its declaration was interrupted).  With
        ``shard``: only on that shard's server (``ShardPending`` if it is unavailable)."""
        cluster = self.rt.store.cluster
        servers = None if shard is None else {topo.shard_servers[shard]}
        found = self.rt.retry("listing fences", lambda: cluster.old_fences(topo, servers), shard)
        old = sorted(db for dbs in found.values() for db, _ in dbs)
        if old:
            raise CatalogError(
                f"index {self.name!r}: fences of an older index epoch remain on "
                f"{', '.join(old[:5])}{' ...' if len(old) > 5 else ''} (a declaration was "
                "interrupted): declare the index again to finish it, then rerun the Cleaner"
            )

    def _wait_grace(self, info: IndexInfo, topo: Topology) -> None:
        catalog = self.rt.store.cluster.catalog
        now = self.rt.retry("reading the catalog's clock", catalog.server_now_us)
        left = grace_deadline(info, topo) - now / 1e6
        if left > 0:
            self.rt.figures.set(state="grace")
            self.rt.progress.message(
                f"{self.name}: waiting {left:.1f}s until every writer maintains the index"
            )
            self.rt.sleep(left)

    def _measure(self) -> None:
        """Each unfinished shard's end, for the estimate (of reachable servers only)."""
        topo = self.rt.store.cluster.current()
        undone = [s.shard for s in self._shards.values() if not s.done]
        for shard, span in added_ranges(self.rt.store, topo, undone, partial=True).items():
            self._shards[shard].span = span

    def _run_rounds(self, topo: Topology, index: Index) -> None:
        """Run the lanes, then write the deferred rows whose servers answer, until no
        shard is left pending and no deferral is left (a server unavailable): each
        round after a pause, on the map read afresh, with the work still undone."""
        rt = self.rt
        rt.begin_pass()
        self._run_lanes(topo, index)
        self.redo.run(topo, index, self._in_parallel)
        delays = backoff_delays(base=1.0, cap=rt.backoff_cap)
        while (rt.pending or self.redo.left) and not rt.stopping:
            delay = next(delays)
            self._warn_waiting(topo, delay)
            rt.sleep(delay)
            rt.begin_pass()
            topo = rt.retry("reading the catalog", rt.store.cluster.refresh)
            rt.retry("measuring shards", self._measure)
            self._run_lanes(topo, index)
            self.redo.run(topo, index, self._in_parallel)

    def _warn_waiting(self, topo: Topology, delay: float) -> None:
        """Log what a round left for the next one: pending shards, deferred rows."""
        rt = self.rt
        if rt.pending:
            log.warning(
                "index %r: logical shard(s) %s pending (%s); the index stays building; "
                "trying them again in %.3gs",
                self.name,
                ", ".join(map(str, sorted(rt.pending))),
                rt.pending[min(rt.pending)],
                delay,
            )
        self.redo.warn(topo, delay)

    def _run_lanes(self, topo: Topology, index: Index) -> None:
        """One lane per server, each running its shards in turn; this thread ticks."""
        lanes = by_server(topo, [s.shard for s in self._shards.values() if not s.done], int)
        self._in_parallel([partial(self._lane, index=index, shards=s) for s in lanes.values()])

    def _in_parallel(self, jobs: list[Callable[[ThreadPoolExecutor], None]]) -> None:
        """Run ``jobs`` (each given the pool, for its reads ahead) at once; this thread
        ticks; the first failure halts the others after their batch, then is raised."""
        if not jobs:
            return
        self.rt.halt.clear()
        with ThreadPoolExecutor(3 * len(jobs), thread_name_prefix="backfill") as pool:
            futures = [pool.submit(job, pool) for job in jobs]
            try:
                while True:
                    done, pending = wait(futures, timeout=0.25, return_when=FIRST_EXCEPTION)
                    self.rt.tick()
                    self._report()
                    failed = [f for f in done if f.exception() is not None]
                    if failed or not pending:
                        break
            finally:
                if any(f.exception() is not None for f in futures if f.done()):
                    self.rt.halt.set()  # the other lanes stop after their batch
                wait(futures)
                self.rt.halt.clear()
            for f in futures:
                exc = f.exception()
                if exc is not None and not isinstance(exc, Stopped):
                    raise exc

    # -- one lane: the shards of one server ------------------------------------------------

    def _lane(self, pool: ThreadPoolExecutor, *, index: Index, shards: list[int]) -> None:
        """The shards of one server in turn, one pipeline across them, after checking
        the server's fences; if a server the work needs stays unavailable, the lane's
        unfinished shards are left pending."""
        writing: Future[None] | None = None
        if [s for s in shards if self.rt.unavailable(s)]:  # the lane's server is down
            return
        try:
            self._check_fences(self.rt.store.cluster.current(), shards[0])
            for shard in shards:
                state = self._shards[shard]
                if not state.done and not self.rt.stopping:
                    writing = self._shard(pool, index, state, writing)
            if writing is not None:
                writing.result()
        except Stopped:
            return
        except ShardPending as exc:
            with self._lock:
                undone = [s for s in shards if not self._shards[s].done]
            for shard in undone:
                self.rt.leave(f"backfill {self.name}", shard, exc.__cause__ or exc)

    def _shard(
        self,
        pool: ThreadPoolExecutor,
        index: Index,
        state: _Shard,
        writing: Future[None] | None,
    ) -> Future[None] | None:
        """One logical shard: while one batch is written (and proven, and checkpointed,
        one write at a time, in order), the next one is derived and the one after it
        read.  ``writing``: the lane's write in flight (of an earlier shard); returns
        the last one, still in flight."""
        after = state.position
        ahead: Future[list[EntityRow]] | None = None
        try:
            while not self.rt.stopping:
                rows, derived, ahead = self.rt.retry(
                    f"backfill {self.name} shard {state.shard}",
                    partial(self._next, pool, index, state.shard, after, ahead),
                    state.shard,
                )
                if writing is not None:
                    writing.result()
                writing = pool.submit(self._write, index, state, after, rows, derived)
                if ahead is None:
                    break
                after = rows[-1][0]
        except BaseException:
            if writing is not None:
                wait([writing])  # it updates a shard's state: let it end first
            raise
        finally:
            if ahead is not None:  # stopped (or failed) with a read ahead in flight
                ahead.cancel()
        return writing

    def _read(self, shard: int, after: int) -> list[EntityRow]:
        topo = self.rt.store.cluster.current()
        return next(entity_batches(self.rt.store, topo, shard, after, self.rt.batch), [])

    def _next(
        self,
        pool: ThreadPoolExecutor,
        index: Index,
        shard: int,
        after: int,
        ahead: Future[list[EntityRow]] | None,
    ) -> tuple[list[EntityRow], Derived, Future[list[EntityRow]] | None]:
        """The batch after ``after`` (read ahead, or now), its index rows, and the read
        of the batch after it (None: this one is the shard's last)."""
        try:
            rows = ahead.result() if ahead is not None else self._read(shard, after)
        except SchemalessError:
            rows = self._read(shard, after)  # the read ahead failed: again, here
        if rows and rows[0][0] <= after:  # a read ahead of a batch that was redone
            rows = self._read(shard, after)
        last = len(rows) < self.rt.batch
        following = None if last else pool.submit(self._read, shard, rows[-1][0])
        failpoints.hit("cleaner.after_read")
        derived = self._derive(index, shard, rows)
        self._set_aside(index, shard, derived)
        return rows, derived, following

    def _derive(self, index: Index, shard: int, rows: list[EntityRow]) -> Derived:
        """A batch's index rows (a body the codec refuses is decoded as ``get`` would)."""
        store = self.rt.store
        return derive(
            index,
            store.codec,
            rows,
            self._placement(store.cluster.current()),
            lambda key, version, body: store.decode(key, shard, version, body),
        )

    def _write(
        self, index: Index, state: _Shard, after: int, rows: list[EntityRow], derived: Derived
    ) -> None:
        """Upsert a batch's rows (in bursts, each paid to the throttle first, when
        ``rt.burst`` is set), prove or reconcile them, checkpoint; the throttle is paid
        for the whole batch by the end."""
        pacer = _Pacer(self.rt, len(rows), derived.rows)
        self.rt.retry(
            f"backfill {self.name} shard {state.shard}",
            partial(self._upsert, index, state, after, rows, derived, pacer),
            state.shard,
        )
        pacer.rest()

    def _upsert(
        self,
        index: Index,
        state: _Shard,
        after: int,
        rows: list[EntityRow],
        derived: Derived,
        pacer: _Pacer,
    ) -> None:
        """Write a batch's rows but those for logical shards on a server that is down,
        which are deferred: recorded with the checkpoint, in one transaction."""
        topo = self.rt.store.cluster.current()
        shard = state.shard
        down = set(self.rt.down)
        kept = only(derived, lambda t: topo.shard_servers[t] not in down)
        targets = derived.targets.keys() - kept.targets.keys()
        if not self._put(topo, index, shard, after, rows, kept, pacer):
            targets |= set(on(topo, down))  # the reconciliation left rows out there
        last = rows[-1][0] if rows else after
        done = len(rows) < self.rt.batch
        deferred = [Deferral(self.name, shard, t, after, last) for t in sorted(targets)]
        if deferred:
            failpoints.hit("cleaner.before_deferral")
        self.redo.deferrals.checkpoint(
            self.job, shard, last, done, state.rows + len(rows), deferred
        )
        with self._lock:
            state.position, state.done, state.rows = last, done, state.rows + len(rows)
        self.rt.figures.add(
            rows_backfilled=kept.rows,
            rows_checked=len(rows),
            rows_deferred=derived.rows - kept.rows,
        )
        failpoints.hit("cleaner.after_batch")

    def _put(
        self,
        topo: Topology,
        index: Index,
        shard: int,
        after: int,
        rows: list[EntityRow],
        derived: Derived,
        pacer: _Pacer | None = None,
    ) -> bool:
        """Upsert ``derived`` (the rows of the batch ``rows`` of ``shard`` read after
        ``after``), record a unique index's duplicates, prove the batch unchanged or
        reconcile what changed; whether no row of that reconciliation was left out
        (none is sent to a server that is ``down``)."""
        store = self.rt.store
        burst = self.rt.burst
        pace = pacer if burst is not None else None
        contested = upsert_grouped(store, topo, index, derived.targets, burst, pace)
        if contested:
            found = store.claims.settle(topo, contested)
            self._duplicates(topo, shard, _unexpired(store, shard, rows, found))
        if rows:
            return self._recheck(topo, index, shard, after, rows, derived, set(self.rt.down))
        return True

    def _duplicates(self, topo: Topology, shard: int, found: list[Violation]) -> None:
        """Record the values of this shard's entities that another live entity owns."""
        if not found:
            return
        with self._lock:
            shown = self._found.setdefault(shard, [])
            shown += [
                {
                    "values": _jsonable(v.row.index.readable(v.row.values)),
                    "ids": sorted([id_hex(v.owner), id_hex(v.row.entity_id)]),
                }
                for v in found
            ]
            count = self._counts[shard] = self._counts.get(shard, 0) + len(found)
            shown = list(shown)
        self.rt.figures.add(duplicates=len(found))
        catalog = self.rt.store.cluster.catalog
        catalog.save_duplicates(self.name, shard, count, shown)

    def _placement(self, topo: Topology) -> Placement:
        """The placement memo of this backfill's index and shard count (shared by the
        lanes: their memo may be cleared or dropped under them, never made wrong)."""
        place = self._place
        if place is None or place.n != topo.n_shards:
            place = self._place = Placement(topo.n_shards)
        return place

    def _set_aside(self, index: Index, shard: int, derived: Derived) -> None:
        """Log (and count) the entities of a batch that cannot be indexed; those whose
        values do not fit are recorded before the batch's checkpoint, so the index
        cannot become ready (``Catalog.set_ready``)."""
        for _, corrupt in derived.corrupt:
            log.error("set aside (cannot decode): %s", corrupt)
        for key, exc in derived.unfit:
            log.warning(
                "set aside for index %r (values do not fit): entity %s on logical shard %d: %s",
                index.name,
                id_hex(key),
                shard,
                exc,
            )
        if derived.corrupt or derived.unfit:
            self.rt.figures.add(corrupt=len(derived.corrupt), unindexable=len(derived.unfit))
        if derived.unfit:
            with self._lock:
                count, shown = self._unfit.get(shard, (0, []))
                shown = shown + [
                    {"entity_id": id_hex(key), "why": str(exc)}
                    for key, exc in derived.unfit[: max(0, _EXAMPLES - len(shown))]
                ]
                count += len(derived.unfit)
                self._unfit[shard] = (count, shown)
            catalog = self.rt.store.cluster.catalog
            catalog.save_unfit(index.name, shard, count, shown)

    def _recheck(
        self,
        topo: Topology,
        index: Index,
        shard: int,
        after: int,
        rows: list[EntityRow],
        derived: Derived,
        down: set[int],
    ) -> bool:
        """Reconcile the rows this batch upserted (``derived``) for entities that a
        writer changed since they were read, but send no row to the servers ``down``;
        whether none was left out.

        The proof that none did: the rows in the batch's ``added_id`` runs are as many
        as were read and their versions add up to the same sum (a row's version only
        grows, and no other row can take a read row's ``added_id``), so nothing changed.
        Otherwise (or with runs too scattered) every version is read again.  The rows
        are read back by primary key: a building index has no ``KEY by_entity`` yet.
        No row of a changed entity's new body is added: its writer wrote them (the
        grace period), and one written here from this read could land after a later
        write's step 3 had deleted it, a stale row nothing removes."""
        store = self.rt.store
        seen = proof(rows)
        if seen.runs is not None:
            now = versions_proof(store, topo, shard, seen.runs)
            if now == (seen.count, seen.total):
                return True
            self.rt.figures.add(rechecked=1)
        server = store.cluster.server_of_shard(topo, shard)
        sql, params = entity_versions_sql(topo.dbs, topo.owned_db, shard, after, rows[-1][0])
        current = {bytes(k): int(v) for k, v in server.run(sql, params)[0]}
        changed = {key for _, key, version, _ in rows if current.get(key) != version}
        if changed:
            entities = read_entities(store, topo, changed)
            n = len(index.columns)
            ours = {
                target: [row for row in group if row[n] in changed]
                for target, group in derived.targets.items()
            }
            found = read_own(store, topo, index, ours)  # an empty group sends nothing
            failpoints.hit("cleaner.before_reconcile")
            return self.repairer.reconcile(
                topo, [index], entities, found, add_missing=False, skip=down
            )
        return True

    def _report(self, force: bool = False) -> None:
        with self._lock:
            shards = list(self._shards.values())
        done = sum(s.rows for s in shards)
        left = sum(s.span.left(s.position, s.rows) for s in shards if not s.done)
        finished = sum(s.done for s in shards)
        self.rt.progress.update(self.name, done, done + left, finished, len(shards), force=force)
        if self._started is not None:
            elapsed = time.monotonic() - self._started
            rows = self.rt.figures.as_dict()["rows_backfilled"]
            self.rt.figures.set(rows_per_s=round(rows / elapsed, 1) if elapsed > 0 else 0.0)
