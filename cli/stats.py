"""Figures read from the servers: backfill progress, entity counts, sizes, heartbeats.

Every read is one statement per server (``UNION ALL`` over its logical shards),
servers in parallel; a server that does not answer makes its figures ``None``
("unknown"), never a guess.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemaless.catalog import Topology, backfill_job, now_us
from schemaless.names import quote
from schemaless.scatter import Statement, bare, by_server, shard_is, shard_unions
from schemaless.schema import shard_db
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


def _per_server(
    ds: DataStore, topo: Topology, part: Callable[[int, str], str]
) -> dict[int, list[tuple[Any, ...]] | None]:
    """Run one ``UNION ALL`` of ``part(shard, db)`` per server; None where it failed.
    Each part reads ``WHERE {shard_is(topo, s)}...`` (the owned layout's tables hold
    every shard of their server)."""
    unions = shard_unions(topo, lambda s: part(s, topo.dbs[s]))
    results = ds.cluster.scatter(topo, unions, bare, partial=True).results
    return {sid: _rows(sid, unions, results) for sid in topo.servers}


def _rows(
    sid: int, calls: Mapping[int, object], results: Mapping[int, Any]
) -> list[tuple[Any, ...]] | None:
    """A server's rows: [] if it was not asked (no shards), None if it did not answer."""
    if sid not in calls:
        return []
    return list(results[sid][0]) if sid in results else None


def max_added_ids(ds: DataStore, topo: Topology) -> dict[int, int | None]:
    """``shard -> MAX(added_id)`` (0 for an empty shard; None if unreachable)."""
    out: dict[int, int | None] = dict.fromkeys(range(topo.n_shards))
    per_server = _per_server(
        ds,
        topo,
        lambda s, db: (
            f"SELECT {int(s)}, COALESCE(MAX(`added_id`), 0) FROM {quote(db, 'entities')}"
            f" WHERE {shard_is(topo, s)}TRUE"
        ),
    )
    for rows in per_server.values():
        for shard, top in rows or ():
            out[int(shard)] = int(top)
    return out


# -- backfill progress -------------------------------------------------------------------


@dataclass(frozen=True)
class ShardProgress:
    """One logical shard's backfill checkpoint against its highest ``added_id``."""

    shard: int
    server: str
    position: int
    top: int | None
    done: bool
    rows: int
    updated_us: int | None

    @property
    def fraction(self) -> float | None:
        """Share of the shard scanned (``position / MAX(added_id)``), None if unknown."""
        if self.done:
            return 1.0
        if self.top is None:
            return None
        if self.top == 0:
            return 1.0  # nothing to scan
        return min(1.0, self.position / self.top)

    @property
    def remaining(self) -> int | None:
        """``added_id`` values still to scan (about the rows left), None if unknown."""
        if self.done:
            return 0
        if self.top is None:
            return None
        return max(0, self.top - self.position)


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
            top = s.top if s.top is not None else s.position
            total += top
            done += top if s.done else min(s.position, top)
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
        """About how many entity rows are left to scan; None if unknown."""
        left = [s.remaining for s in self.shards]
        return None if any(r is None for r in left) else sum(r or 0 for r in left)

    @property
    def scanned(self) -> int:
        """Sum of the checkpoint positions (for rates between two snapshots)."""
        return sum(s.position for s in self.shards)

    @property
    def shards_done(self) -> int:
        """Shards with nothing left to scan."""
        return sum(1 for s in self.shards if s.fraction == 1.0)

    @property
    def last_checkpoint_us(self) -> int | None:
        """When the most recent checkpoint was saved."""
        times = [s.updated_us for s in self.shards if s.updated_us is not None]
        return max(times) if times else None


def checkpoints(ds: DataStore, job: str) -> dict[int, tuple[int, bool, int, int]]:
    """``shard -> (position, done, rows_done, updated_us)`` of a Cleaner job."""
    catalog = ds.cluster.catalog
    table = quote(catalog.db, "checkpoints")
    rows = catalog.server.run(
        f"SELECT `shard`, `position`, `done`, `rows_done`, `updated` FROM {table} WHERE `job` = %s",
        (job,),
    )[0]
    return {int(s): (int(p), bool(d), int(n), int(u)) for s, p, d, n, u in rows}


def backfill(ds: DataStore, name: str, tops: dict[int, int | None] | None = None) -> Backfill:
    """Per shard: the Cleaner's checkpoint of ``backfill:<name>`` and MAX(added_id).

    ``tops``: the maxima if already read (see :func:`max_added_ids`).
    """
    topo = ds.cluster.current()
    taken = time.monotonic()
    marks = checkpoints(ds, backfill_job(name))
    if tops is None:
        tops = max_added_ids(ds, topo)
    shards = []
    for shard in range(topo.n_shards):
        position, done, rows, updated = marks.get(shard, (0, False, 0, None))
        server = topo.servers[topo.shard_servers[shard]]
        shards.append(ShardProgress(shard, str(server), position, tops[shard], done, rows, updated))
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
    sizes: dict[int, int] | None  # bytes per shard (data + indexes)
    catalog_size: int | None  # bytes of <prefix>_catalog, on the first server only
    estimated: bool = False


def server_figures(ds: DataStore, *, estimate: bool = False) -> list[ServerFigures]:
    """Counts (exact, or InnoDB's estimate) and sizes for every server."""
    topo = ds.cluster.current()
    if estimate and topo.owned_db is None:  # the owned layout's tables hold many shards
        counts = _estimated_counts(ds, topo)
    else:
        counts = _per_server(
            ds,
            topo,
            lambda s, db: (
                f"SELECT {int(s)}, COUNT(`body`), COUNT(*) - COUNT(`body`)"
                f" FROM {quote(db, 'entities')} WHERE {shard_is(topo, s)}TRUE"
            ),
        )
    sizes = _sizes(ds, topo)
    catalog_sid = next(
        (sid for sid, a in topo.servers.items() if a == ds.cluster.catalog.server.address), None
    )
    out = []
    for sid, address in sorted(topo.servers.items()):
        shards = topo.shards_of(sid)
        rows = counts.get(sid)
        live = tomb = None
        if rows is not None:
            live, tomb = {}, {}
            for shard, alive, dead in rows:
                live[int(shard)] = int(alive)
                if dead is not None:
                    tomb[int(shard)] = int(dead)
        size_rows = sizes.get(sid)
        by_shard = None
        catalog_size = None
        if size_rows is not None:
            dbs = {shard_db(topo.prefix, s): s for s in shards}
            by_shard = dict.fromkeys(shards, 0)
            for schema, size in size_rows:
                if schema in dbs:
                    by_shard[dbs[schema]] = int(size or 0)
                elif schema == topo.owned_db:
                    by_shard = _shares(int(size or 0), shards, live, tomb)
                elif sid == catalog_sid:
                    catalog_size = int(size or 0)
        out.append(
            ServerFigures(sid, str(address), shards, live, tomb, by_shard, catalog_size, estimate)
        )
    return out


def _shares(
    size: int, shards: list[int], live: dict[int, int] | None, tomb: dict[int, int] | None
) -> dict[int, int]:
    """The owned layout: a server's data database split over its shards by their
    entity rows (evenly if they are unknown or none)."""
    rows = {s: (live or {}).get(s, 0) + (tomb or {}).get(s, 0) for s in shards}
    total = sum(rows.values())
    if not total:
        return {s: size // max(1, len(shards)) for s in shards}
    return {s: size * n // total for s, n in rows.items()}


def _estimated_counts(ds: DataStore, topo: Topology) -> dict[int, list[tuple[Any, ...]] | None]:
    """InnoDB's row estimates (no split between live entities and tombstones)."""
    index = {shard_db(topo.prefix, s): s for s in range(topo.n_shards)}
    groups = by_server(topo, range(topo.n_shards), int)

    def build(shards: list[int]) -> Statement:
        marks = ", ".join(["%s"] * len(shards))
        return (
            "SELECT table_schema, table_rows FROM information_schema.tables"
            f" WHERE table_name = 'entities' AND table_schema IN ({marks})",
            tuple(shard_db(topo.prefix, s) for s in shards),
        )

    results = ds.cluster.scatter(topo, groups, build, partial=True).results
    out: dict[int, list[tuple[Any, ...]] | None] = {}
    for sid in topo.servers:
        rows = _rows(sid, groups, results)
        out[sid] = None if rows is None else [(index[str(db)], int(n or 0), None) for db, n in rows]
    return out


def _sizes(ds: DataStore, topo: Topology) -> dict[int, list[tuple[Any, ...]] | None]:
    """``(schema, data_length + index_length)`` of the prefix's databases per server."""

    def build(sid: int) -> Statement:
        dbs = [shard_db(topo.prefix, s) for s in topo.shards_of(sid)]
        dbs += [topo.owned_db] if topo.owned_db is not None else []
        dbs.append(ds.cluster.catalog.db)
        marks = ", ".join(["%s"] * len(dbs))
        return (
            "SELECT table_schema, SUM(data_length + index_length)"
            f" FROM information_schema.tables WHERE table_schema IN ({marks})"
            " GROUP BY table_schema",
            tuple(dbs),
        )

    results = ds.cluster.scatter(topo, {sid: sid for sid in topo.servers}, build, partial=True)
    return {
        sid: (list(results.results[sid][0]) if sid in results.results else None)
        for sid in topo.servers
    }
