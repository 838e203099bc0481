"""One backfill batch, computed a batch at a time: rows, placement, the version proof.

The backfill's client work is per entity, so this path builds no object per row: each
live entity's body is decoded once, its index rows become flat tuples
``(values..., entity_id, version)`` grouped by the logical shard they live on (sorted,
as the write protocol sends them), and the batch's versions are summed for the
re-check (``Proof``).  Entities whose body cannot be decoded, or whose values do not
fit the index, are set aside with the error that says why.

An index of one int column, the common case, goes through ``_rows.int_rows`` first (C,
built with the package): it reads the one property out of each body without building
the entity and places it, and leaves every row it is not certain of to the Python path
below, which stays the reference (tests/test_cleaner_rows.py checks the two agree).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemaless.codec import Codec
from schemaless.errors import CorruptEntity, InvalidEntity
from schemaless.hashing import placer
from schemaless.index import Index, key_encode

from .native import rows as _rows
from .scan import EntityRow

__all__ = ["Derived", "Placement", "Proof", "derive", "proof", "runs"]

#: Above this many ``added_id`` runs, the re-check reads every version instead.
MAX_RUNS = 64


class Placement:
    """The logical shard of an index row from its ``shard_on`` value (``shard_of`` of
    its canonical bytes), memoised per value while values repeat (users, feeds,
    links): after ``sample`` look-ups, if more than half were new values (times,
    unique ids), the memo costs more than it saves and is dropped (``fast`` is then
    the placement itself).  One index's values are coerced to one type, and equal
    values of one type have equal canonical bytes.
    """

    def __init__(self, n_shards: int, sample: int = 20_000, limit: int = 200_000) -> None:
        self.n = n_shards
        self.sample = sample
        self.limit = limit
        self.known: dict[Any, int] | None = {}
        self.lookups = 0
        self.direct = placer(n_shards, key_encode)

    @property
    def fast(self) -> Callable[[Any], int]:
        """What to call for a batch: the memo while it pays, the placement after."""
        return self.direct if self.known is None else self

    def __call__(self, value: Any) -> int:
        known = self.known
        if known is None:
            return self.direct(value)
        shard = known.get(value)
        if shard is None:
            shard = known[value] = self.direct(value)
            if len(known) >= self.limit:
                known.clear()
        self.lookups += 1
        if self.lookups == self.sample and len(known) > self.sample // 2:
            self.known = None
        return shard


@dataclass(frozen=True, slots=True)
class Proof:
    """What the re-check compares: the batch's rows, as runs of consecutive
    ``added_id`` (``None``: too scattered, read every version), their number, and the
    sum of their versions."""

    runs: list[tuple[int, int]] | None
    count: int
    total: int


@dataclass(slots=True)
class Derived:
    """A batch's index rows by logical shard (each list sorted), how many, and the
    entities set aside: ``(id, error)``."""

    targets: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    rows: int = 0
    corrupt: list[tuple[bytes, CorruptEntity]] = field(default_factory=list)
    unfit: list[tuple[bytes, InvalidEntity]] = field(default_factory=list)


def int_column(index: Index) -> str | None:
    """The property of an index of one int column on a top-level property (a path
    or a partial index takes the Python path) when ``_rows`` is built, else None."""
    if _rows is None or index.multi_pos is not None or len(index.properties) != 1 or index.filter:
        return None
    prop = index.properties[0]
    return prop if index.types[0].name == "int" and "." not in prop else None


def derive(
    index: Index,
    codec: Codec,
    batch: list[EntityRow],
    place: Placement,
    recover: Callable[[bytes, int, bytes], Mapping[str, Any]],
) -> Derived:
    """The index rows of a batch's live entities, grouped by the shard they live on.

    A body the codec refuses goes to ``recover(id, version, body)`` (which takes up a
    dictionary trained meanwhile, or raises a ``CorruptEntity`` that names the
    entity)."""
    out = Derived()
    groups: list[list[tuple[Any, ...]]] = [[] for _ in range(place.n)]
    prop = int_column(index)
    if prop is not None:
        rest = _rows.int_rows(batch, prop, place.n, codec.payload, groups)
        batch = [batch[i] for i in rest]
    decode = codec.decode
    rows_of = index.rows
    pos = index.shard_pos
    place_one = place.fast
    single = len(index.properties) == 1 and index.multi_pos is None
    one = index.value
    entity: Mapping[str, Any]
    for _, key, version, body in batch:
        if body is None:
            continue
        try:
            try:
                entity = decode(body)
            except CorruptEntity:
                entity = recover(key, version, body)
            if single:  # one column: no set, tuple and list per entity
                value = one(entity)
                if value is not None:
                    groups[place_one(value)].append((value, key, version))
                continue
            for values in rows_of(entity):
                groups[place_one(values[pos])].append((*values, key, version))
        except CorruptEntity as exc:
            out.corrupt.append((key, exc))
        except InvalidEntity as exc:
            out.unfit.append((key, exc))
    for shard, group in enumerate(groups):
        if group:
            group.sort()
            out.targets[shard] = group
            out.rows += len(group)
    return out


def runs(added: Sequence[int], limit: int = MAX_RUNS) -> list[tuple[int, int]] | None:
    """Ascending ``added_id`` values as ``(first, last)`` runs of consecutive values;
    None when there would be more than ``limit`` runs."""
    out: list[tuple[int, int]] = []
    if not added:
        return out
    first = prev = added[0]
    for value in added[1:]:
        if value != prev + 1:
            out.append((first, prev))
            if len(out) >= limit:
                return None
            first = value
        prev = value
    out.append((first, prev))
    return out


def proof(batch: Sequence[EntityRow]) -> Proof:
    """The re-check's proof of a batch read: its ``added_id`` runs, rows and versions."""
    return Proof(runs([r[0] for r in batch]), len(batch), sum(r[2] for r in batch))
