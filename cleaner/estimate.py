"""What backfilling an index would find, from a sample of the stored entities.

``schemaless index create ... --dry-run`` prints it; nothing is written.  Each logical
shard is read in a few segments of consecutive ``added_id`` from spread, random-ish
starting points, with the backfill's own scan (``entity_batches``) and row building
(``Index.rows`` on the decoded body); a shard small enough is read whole, and its
figures are exact.  A shard's rows lie between its lowest and highest ``added_id``; a
segment's span tells how dense they are there (purged tombstones leave gaps, and in the
owned layout so do the other shards of the server, whose rows share the counter), so
each sampled row stands for ``(MAX(added_id) - MIN(added_id) + 1) / span`` rows.
The ranges are measured first, in one statement per server, and the sample keeps only
rows within them: the figures are those of the rows stored at that time (``as_of``),
whatever a writer adds while the shards are read.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from schemaless.catalog import Topology
from schemaless.errors import CorruptEntity
from schemaless.fit import Fit
from schemaless.index import Index
from schemaless.scatter import by_server, unreachable_only
from schemaless.store import DataStore

from .scan import EntityRow, entity_batches
from .sql import added_ranges_sql

__all__ = ["Estimate", "Span", "added_ranges", "estimate"]

#: Entity rows read at most, over all shards (at least ``_PER_SHARD`` per shard).
SAMPLE = 20_000
_PER_SHARD = 100
_SEGMENTS = 10  # reads per sampled shard (more: less bias when values cluster in time)
#: Per index row besides its values: entity_id twice (row and ``by_entity`` key), the
#: version, InnoDB's record headers (5 + 5), transaction id (6) and roll pointer (7).
_ROW_OVERHEAD = 2 * 16 + 8 + 5 + 5 + 6 + 7
#: B-tree pages filled in random key order end about this full.
_PAGE_FILL = 0.7


@dataclass
class Estimate:
    """A backfill's figures, from a sample (weights make them whole-datastore totals)."""

    index: Index
    shards: int
    grace: float  # seconds a backfill waits before it starts (every writer maintains it)
    as_of: float = 0.0  # when the shards' ranges were measured: the sample's rows are older
    sampled: int = 0  # entity rows read, tombstones included
    exact: bool = True  # every entity row was read
    stored: float = 0.0  # entity rows, tombstones included
    entities: float = 0.0  # live entities
    rows: float = 0.0  # index rows
    rowless: float = 0.0  # live entities without a value to index (no row, not an error)
    unindexable: float = 0.0  # live entities with a value that does not fit its column
    corrupt: float = 0.0
    row_bytes: float = 0.0  # the index rows' bytes, InnoDB overheads included
    missing: list[int] = field(default_factory=list)  # shards of servers that did not answer
    unreachable: list[str] = field(default_factory=list)  # those servers' addresses
    seconds: float = 0.0  # reading, decoding and building the rows of the sample
    found: Fit = field(init=False)  # the sample's misfits and (unique) repeats, unweighted

    def __post_init__(self) -> None:
        self.found = Fit(self.index)

    @property
    def size(self) -> float:
        """Estimated bytes of the index tables (both B-trees, pages ``_PAGE_FILL`` full)."""
        return self.row_bytes / _PAGE_FILL

    @property
    def rate(self) -> float | None:
        """Entity rows per second of the sample's read, decode and row build."""
        return self.sampled / self.seconds if self.seconds > 0 else None

    @property
    def eta(self) -> float | None:
        """The grace period, then every stored row at ``rate`` (None: unknown)."""
        if not self.sampled:
            return 0.0
        rate = self.rate
        return None if rate is None else self.grace + self.stored / rate

    def share(self, count: float) -> float | None:
        """``count`` as a share of the live entities (None when there are none)."""
        return count / self.entities if self.entities else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly figures (estimates rounded)."""
        return {
            "index": self.index.to_dict(),
            "shards": self.shards,
            "as_of": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.as_of)),
            "sampled_rows": self.sampled,
            "exact": self.exact,
            "missing_shards": self.missing,
            "unreachable": self.unreachable,
            "stored_rows": round(self.stored),
            "entities": round(self.entities),
            "index_rows": round(self.rows),
            "rows_per_entity": round(self.rows / self.entities, 3) if self.entities else None,
            "entities_without_rows": round(self.rowless),
            "unindexable": round(self.unindexable),
            "unindexable_share": self.share(self.unindexable),
            "corrupt": round(self.corrupt),
            "size_bytes": round(self.size),
            "rows_per_s": None if self.rate is None else round(self.rate, 1),
            "grace_s": self.grace,
            "eta_s": None if self.eta is None else round(self.eta, 1),
            "examples": [
                {"entity_id": key, "shard": shard, "message": message}
                for key, shard, message in self.found.unfit_examples
            ],
            "duplicates_in_sample": self.found.repeated,
            "duplicate_examples": [
                {"entity_id": key, "shard": shard, "message": message}
                for key, shard, message in self.found.repeat_examples
            ],
        }


class Span(NamedTuple):
    """A logical shard's ``added_id`` range when measured: its rows lie in ``(before,
    top]``; ``share`` is the part of that range expected to be its rows (1 where
    ``added_id`` counts the shard's rows; in the owned layout it counts a server's, so
    1/k with k shards on the server) until a scan has seen how dense it is."""

    before: int
    top: int
    share: float

    def left(self, position: int, rows: int) -> int:
        """Rows still to scan after ``added_id`` ``position``, ``rows`` read up to it:
        the range left times the density seen (``share`` before any row)."""
        seen = position - self.before
        density = rows / seen if rows and seen > 0 else self.share
        return round(max(0, self.top - max(self.before, position)) * min(1.0, density))


def added_ranges(
    store: DataStore, topo: Topology, shards: Iterable[int] | None = None, *, partial: bool = False
) -> dict[int, Span]:
    """Each logical shard's ``Span`` (``(0, 0)`` for an empty shard) of ``shards``
    (default all), one statement per server; ``partial``: without the shards of
    unavailable servers."""
    groups = by_server(topo, range(topo.n_shards) if shards is None else shards, int)
    found = store.cluster.scatter(
        topo,
        groups,
        lambda group: (added_ranges_sql(topo.dbs, topo.owned_db, group), ()),
        partial=partial,
    )
    unreachable_only(found.errors)
    held = Counter(topo.shard_servers)
    share = [1.0 if topo.owned_db is None else 1 / held[sid] for sid in topo.shard_servers]
    return {
        int(s): Span(int(before), int(top), share[int(s)])
        for rows in found.results.values()
        for s, before, top in rows[0]
    }


def estimate(
    store: DataStore, index: Index, sample: int = SAMPLE, *, partial: bool = False
) -> Estimate:
    """Sample every logical shard (see the module docstring); the figures.  ``partial``:
    the shards of servers that do not answer are left out (``missing``), not an error."""
    topo = store.cluster.refresh()
    # the backfill's grace period (``backfill.grace_deadline``), from the declaration
    out = Estimate(index, topo.n_shards, grace=2 * topo.refresh_interval + 1.0)
    budget = max(_PER_SHARD, sample // max(1, topo.n_shards))
    out.as_of = time.time()
    ranges = added_ranges(store, topo, partial=partial)
    out.missing = [s for s in range(topo.n_shards) if s not in ranges]
    out.unreachable = topo.addresses_of(out.missing)
    out.exact = not out.missing
    for shard, (before, top, _) in sorted(ranges.items()):
        if not top:
            continue
        started = time.perf_counter()
        segments = _read(store, topo, shard, before, top, budget)
        span = sum(s for _, s in segments)
        exact = top - before <= budget
        out.exact &= exact
        for rows, _ in segments:
            _tally(out, store, shard, rows, 1.0 if exact else (top - before) / span)
        out.seconds += time.perf_counter() - started
    return out


def _read(
    store: DataStore, topo: Topology, shard: int, before: int, top: int, budget: int
) -> list[tuple[list[EntityRow], int]]:
    """Segments of a shard's rows (``added_id`` in ``(before, top]``: a row written since
    ``top`` was measured is left out), each with the ``added_id`` span it covers; the
    whole shard in one if ``top - before <= budget``."""

    def upto_top(start: int, n: int) -> list[EntityRow]:
        return [r for r in next(entity_batches(store, topo, shard, start, n), []) if r[0] <= top]

    if top - before <= budget:
        return [(upto_top(before, budget), top - before)]
    rnd = random.Random(shard)  # random-ish, and the same sample each time
    size = budget // _SEGMENTS
    width = (top - before) // _SEGMENTS
    out = []
    for i in range(_SEGMENTS):
        start = before + i * width + rnd.randrange(max(1, width - size))
        rows = upto_top(start, size)
        end = rows[-1][0] if len(rows) == size else top
        out.append((rows, max(1, end - start)))
    return out


def _tally(out: Estimate, store: DataStore, shard: int, rows: list[EntityRow], w: float) -> None:
    """Add a segment's rows, each standing for ``w`` rows of its shard."""
    decode = store.codec.decode
    index = out.index
    for _, key, _, body in rows:
        out.sampled += 1
        out.stored += w
        if body is None:
            continue
        out.entities += w
        try:
            entity = decode(body)
        except CorruptEntity:
            out.corrupt += w
            continue
        produced = out.found.add(key, shard, entity)
        if produced is None:
            out.unindexable += w
            continue
        if not produced:
            out.rowless += w
        out.rows += w * len(produced)
        out.row_bytes += w * sum(_row_bytes(index, row) for row in produced)


def _row_bytes(index: Index, row: tuple[Any, ...]) -> int:
    """One index row's bytes: its values in the row and in the ``by_entity`` key, and
    the overhead (``_ROW_OVERHEAD``)."""
    values = 0
    for value, ctype in zip(row, index.types, strict=True):
        if isinstance(value, (str, bytes)) and ctype.name != "uuid":
            data = value.encode() if isinstance(value, str) else value
            values += len(data) + (1 if ctype.key_bytes <= 255 else 2)  # length prefix
        else:
            values += ctype.key_bytes
    return 2 * values + _ROW_OVERHEAD
