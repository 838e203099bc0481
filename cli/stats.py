"""Figures read from the servers: backfill progress, entity counts, sizes, heartbeats.

Every read is one statement per server (``UNION ALL`` over its logical shards; in the
owned layout a ``GROUP BY shard`` over the shards of the map, with the ownership
check), servers in parallel; a server that does not answer makes its figures ``None``
("unknown"), never a guess.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schemaless.catalog import Topology, backfill_job, now_us
from schemaless.cleaner import estimate as cleaner_estimate  # type: ignore[attr-defined, unused-ignore]
from schemaless.names import quote
from schemaless.owned import shards_sql
from schemaless.scatter import Statement, bare, server_reads
from schemaless.store import DataStore

__all__ = [
    "Backfill",
    "Heartbeat",
    "ServerFigures",
    "ShardProgress",
    "backfill",
    "figure",
    "heartbeats",
    "server_figures",
]


def _per_shard(
    ds: DataStore, topo: Topology, columns: str, empty: tuple[Any, ...]
) -> dict[int, dict[int, tuple[Any, ...]] | None]:
    """Per server, ``shard -> columns`` aggregated over each of its logical shards'
    entity rows (``empty`` for a shard without any); None where it did not answer.  A
    shard whose move is past its copy (owned layout: maybe fenced, unreadable until
    the move ends) is left out, so its server's other shards are still counted."""
    moved = topo.moves.items() if topo.owned_db is not None else ()
    fenced = {s for s, (_, _, phase) in moved if phase != "copying"}
    calls = server_reads(
        topo,
        lambda db, shards: (  # one table: a group per shard, those of the map only
            f"SELECT `shard`, {columns} FROM {quote(db, 'entities')}"
            f" WHERE {shards_sql(shards)} GROUP BY `shard`"
        ),
        lambda s: f"SELECT {int(s)}, {columns} FROM {quote(topo.dbs[s], 'entities')}",
        skip=fenced,
    )
    results = ds.cluster.scatter(topo, calls, bare, partial=True).results
    out: dict[int, dict[int, tuple[Any, ...]] | None] = {}
    for sid in topo.servers:
        rows = _rows(sid, calls, results)
        shards = [s for s in topo.shards_of(sid) if s not in fenced]
        found = None if rows is None else dict.fromkeys(shards, empty)
        if found is not None:
            found.update({int(r[0]): tuple(r[1:]) for r in rows or ()})
        out[sid] = found
    return out


def _rows(
    sid: int, calls: Mapping[int, object], results: Mapping[int, Any]
) -> list[tuple[Any, ...]] | None:
    """A server's rows: [] if it was not asked (no shards), None if it did not answer."""
    if sid not in calls:
        return []
    return list(results[sid][0]) if sid in results else None


def added_ranges(ds: DataStore, topo: Topology) -> dict[int, cleaner_estimate.Span | None]:
    """Each logical shard's ``Span`` (the Cleaner's: its ``added_id`` range, two dives
    into the key a shard, and its expected share of rows), None where its server did
    not answer."""
    found = cleaner_estimate.added_ranges(ds, topo, partial=True)
    return {s: found.get(s) for s in range(topo.n_shards)}


# -- backfill progress -------------------------------------------------------------------


@dataclass(frozen=True)
class ShardProgress:
    """One logical shard's backfill checkpoint within its ``added_id`` range."""

    shard: int
    server: str
    position: int
    top: int | None  # MAX(added_id); None if unknown
    done: bool
    rows: int
    updated_us: int | None
    before: int = 0  # MIN(added_id) - 1: the owned layout's shards start past 0
    share: float = 1.0  # of its range expected to be its rows (owned: 1/k, k on its server)

    @property
    def scanned(self) -> int:
        """``added_id`` values scanned (from the start of the shard's range)."""
        return max(0, self.position - self.before)

    @property
    def fraction(self) -> float | None:
        """Share of the shard's range scanned, None if unknown."""
        if self.done:
            return 1.0
        if self.top is None:
            return None
        if self.top <= self.before:
            return 1.0  # nothing to scan
        return min(1.0, self.scanned / (self.top - self.before))

    @property
    def remaining(self) -> int | None:
        """``added_id`` values still to scan, None if unknown."""
        if self.done:
            return 0
        if self.top is None:
            return None
        return max(0, self.top - max(self.position, self.before))

    @property
    def remaining_rows(self) -> int | None:
        """About the rows still to scan, as the Cleaner's progress counts them (in the
        owned layout a shard's range also holds its server's other shards' rows)."""
        if self.done:
            return 0
        if self.top is None:
            return None
        return int(
            cleaner_estimate.Span(self.before, self.top, self.share).left(self.position, self.rows)
        )


@dataclass(frozen=True)
class Backfill:
    """A snapshot of one index's backfill."""

    index: str
    taken: float  # time.monotonic() of the snapshot
    shards: list[ShardProgress] = field(default_factory=list)

    @property
    def fraction(self) -> float | None:
        """Overall share scanned, weighted by each shard's size; None if any is unknown."""
        total = done = 0
        for s in self.shards:
            if s.top is None and not s.done:
                return None
            size = max(0, s.top - s.before) if s.top is not None else s.scanned
            total += size
            done += size if s.done else min(s.scanned, size)
        return 1.0 if total == 0 else done / total

    @property
    def unreachable(self) -> list[str]:
        """The servers whose shards' figures could not be read."""
        return sorted({s.server for s in self.shards if s.top is None})

    @property
    def rows(self) -> int:
        """Rows the Cleaner reports as backfilled so far."""
        return sum(s.rows for s in self.shards)

    @property
    def remaining(self) -> int | None:
        """``added_id`` values left to scan over the shards; None if unknown."""
        return _total([s.remaining for s in self.shards])

    @property
    def remaining_rows(self) -> int | None:
        """About how many entity rows are left to scan; None if unknown."""
        return _total([s.remaining_rows for s in self.shards])

    @property
    def scanned(self) -> int:
        """``added_id`` values scanned over the shards (for rates between two snapshots)."""
        return sum(s.scanned for s in self.shards)

    @property
    def shards_done(self) -> int:
        """Shards with nothing left to scan."""
        return sum(1 for s in self.shards if s.fraction == 1.0)

    @property
    def last_checkpoint_us(self) -> int | None:
        """When the most recent checkpoint was saved."""
        times = [s.updated_us for s in self.shards if s.updated_us is not None]
        return max(times) if times else None


def _total(figures: list[int | None]) -> int | None:
    """Their sum; None if any is unknown."""
    return None if any(f is None for f in figures) else sum(f or 0 for f in figures)


def checkpoints(ds: DataStore, job: str) -> dict[int, tuple[int, bool, int, int]]:
    """``shard -> (position, done, rows_done, updated_us)`` of a Cleaner job."""
    catalog = ds.cluster.catalog
    table = quote(catalog.db, "checkpoints")
    rows = catalog.server.run(
        f"SELECT `shard`, `position`, `done`, `rows_done`, `updated` FROM {table} WHERE `job` = %s",
        (job,),
    )[0]
    return {int(s): (int(p), bool(d), int(n), int(u)) for s, p, d, n, u in rows}


def backfill(
    ds: DataStore, name: str, ranges: dict[int, cleaner_estimate.Span | None] | None = None
) -> Backfill:
    """Per shard: the Cleaner's checkpoint of ``backfill:<name>`` and the shard's
    ``added_id`` range (``ranges``: if already read, see :func:`added_ranges`)."""
    topo = ds.cluster.current()
    taken = time.monotonic()
    marks = checkpoints(ds, backfill_job(name))
    if ranges is None:
        ranges = added_ranges(ds, topo)
    shards = []
    for shard in range(topo.n_shards):
        position, done, rows, updated = marks.get(shard, (0, False, 0, None))
        before, top, share = ranges[shard] or (0, None, 1.0)
        server = str(topo.servers[topo.shard_servers[shard]])
        progress = ShardProgress(shard, server, position, top, done, rows, updated, before, share)
        shards.append(progress)
    return Backfill(name, taken, shards)


# -- heartbeats ----------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat:
    """A daemon's last report in the catalog."""

    name: str
    age: float  # seconds since the heartbeat
    figures: dict[str, Any]


def heartbeats(ds: DataStore) -> list[Heartbeat]:
    """Every daemon's last heartbeat, most recent first."""
    now = now_us()
    beats = [
        Heartbeat(name, max(0.0, (now - at) / 1e6), figures if isinstance(figures, dict) else {})
        for name, (at, figures) in ds.cluster.catalog.statuses().items()
    ]
    return sorted(beats, key=lambda b: b.age)


def figure(figures: Mapping[str, Any], index: str | None, *keys: str, scoped: bool = False) -> Any:
    """The first numeric one of ``keys`` in a heartbeat's figures: for ``index`` first
    (under ``figures["indexes"][index]`` or ``figures[index]``), then at the top level
    (only if ``figures["index"]`` names it, when ``scoped``)."""
    scopes: list[Mapping[str, Any]] = []
    if index is not None:
        nested = figures.get("indexes")
        if isinstance(nested, Mapping) and isinstance(nested.get(index), Mapping):
            scopes.append(nested[index])
        if isinstance(figures.get(index), Mapping):
            scopes.append(figures[index])
    if (
        index is None
        or figures.get("index") == index
        or (not scoped and figures.get("index") is None)
    ):
        scopes.append(figures)
    for scope in scopes:
        for key in keys:
            value = scope.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return value
    return None


# -- per-server figures --------------------------------------------------------------


@dataclass(frozen=True)
class ServerFigures:
    """Entity counts and sizes of one server's logical shards."""

    server_id: int
    address: str
    shards: list[int]
    live: dict[int, int] | None  # per shard; None if unknown
    tombstones: dict[int, int] | None
    sizes: dict[int, int] | None  # bytes per shard; None if unknown or not per shard (owned)
    size: int | None  # bytes of its shards' tables (owned layout: its data database)
    catalog_size: int | None  # bytes of <prefix>_catalog, on the first server only
    estimated: bool = False
    rows: int | None = None  # the estimate of its entity rows, when not per shard (owned)

    @property
    def live_total(self) -> int | None:
        """Its live entities (estimated: its entity rows), None if unknown."""
        if self.rows is not None:
            return self.rows
        return None if self.live is None else sum(self.live.values())


def server_figures(ds: DataStore, *, estimate: bool = False) -> list[ServerFigures]:
    """Counts (exact, or InnoDB's estimate) and sizes for every server."""
    topo = ds.cluster.current()
    counts = {} if estimate else _per_shard(ds, topo, _COUNTS, (0, 0))
    estimates = _by_schema(ds, topo, "table_rows", "table_name = 'entities'") if estimate else {}
    sizes = _by_schema(ds, topo, "data_length + index_length")
    catalog_db = ds.cluster.catalog.db
    out = []
    for sid, address in sorted(topo.servers.items()):
        shards = topo.shards_of(sid)
        live = tomb = by_shard = size = catalog_size = rows = None
        if (found := counts.get(sid)) is not None:
            live = {s: int(n) for s, (n, _) in found.items()}
            tomb = {s: int(d) for s, (_, d) in found.items()}
        if (guessed := estimates.get(sid)) is not None:
            live, tomb = {}, {}  # no split between live entities and tombstones
            if topo.owned_db is not None:  # one table: no figure per shard
                rows = guessed.get(topo.owned_db, 0)
            else:
                live = {s: guessed.get(topo.dbs[s], 0) for s in shards}
        if (by_db := sizes.get(sid)) is not None:
            catalog_size = by_db.pop(catalog_db, None)
            size = sum(by_db.values())
            if topo.owned_db is None:
                by_shard = {s: by_db.get(topo.dbs[s], 0) for s in shards}
        out.append(
            ServerFigures(
                sid, str(address), shards, live, tomb, by_shard, size, catalog_size, estimate, rows
            )
        )
    return out


_COUNTS = "COUNT(`body`), COUNT(*) - COUNT(`body`)"


def _by_schema(
    ds: DataStore, topo: Topology, figure: str, where: str = ""
) -> dict[int, dict[str, int] | None]:
    """Per server, ``schema -> SUM(figure)`` over the tables (``where``) of its shard
    databases (owned layout: its data database) and the catalog, from
    ``information_schema``; None where it did not answer."""

    def build(sid: int) -> Statement:
        dbs = [topo.owned_db] if topo.owned_db else [topo.dbs[s] for s in topo.shards_of(sid)]
        dbs.append(ds.cluster.catalog.db)
        marks = ", ".join(["%s"] * len(dbs))
        return (
            f"SELECT table_schema, SUM({figure}) FROM information_schema.tables"
            f" WHERE table_schema IN ({marks}){' AND ' + where if where else ''}"
            " GROUP BY table_schema",
            tuple(dbs),
        )

    results = ds.cluster.scatter(topo, {sid: sid for sid in topo.servers}, build, partial=True)
    return {
        sid: (
            {str(db): int(n or 0) for db, n in results.results[sid][0]}
            if sid in results.results
            else None
        )
        for sid in topo.servers
    }
