"""The oracle: recompute every index row from the entities and compare.

Decodes every live entity on every shard, computes the rows each index should hold,
and diffs them with the index tables: rows ``missing`` (a committed entity the index
would miss), ``extra`` (orphans: rows no live entity produces) and ``behind`` (a row
the entity produces whose ``entity_version`` is below the entity's version).  With
``partial``, a logical shard whose server is unavailable is not read: rows of its
entities or in its index tables are not compared, and it is listed as ``unverified``.
A unique index's row of an expired entity not yet deleted is neither expected nor an
orphan: a claimer may have taken it over (docs/architecture.md, "Unique indexes").
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from schemaless.catalog import IndexState
from schemaless.errors import CorruptEntity, InvalidEntity, ShardUnavailable
from schemaless.expiry import expired
from schemaless.hashing import shard_of
from schemaless.index import Index
from schemaless.store import DataStore

from .scan import entity_batches, index_rows

__all__ = ["Diff", "RowKey", "diff_indexes", "expected_rows"]

T = TypeVar("T")

#: (logical shard, values, entity_id)
RowKey = tuple[int, tuple[Any, ...], bytes]
Rows = dict[str, dict[RowKey, int]]


@dataclass
class Diff:
    """What one index holds that it should not, and what it lacks."""

    missing: dict[RowKey, int] = field(default_factory=dict)  # -> entity version
    extra: dict[RowKey, int] = field(default_factory=dict)  # -> entity_version in the row
    behind: dict[RowKey, tuple[int, int]] = field(default_factory=dict)  # -> (row, entity)
    unindexable: list[bytes] = field(default_factory=list)  # entities whose values don't fit
    unverified: list[int] = field(default_factory=list)  # logical shards not read (partial)

    @property
    def clean(self) -> bool:
        """No missing, extra or behind rows."""
        return not (self.missing or self.extra or self.behind)

    def summary(self) -> dict[str, int]:
        """Counts, for reports."""
        return {
            "missing": len(self.missing),
            "extra": len(self.extra),
            "behind": len(self.behind),
            "unindexable": len(self.unindexable),
        }


def expected_rows(
    store: DataStore, indexes: Iterable[Index], unread: set[int] | None = None
) -> tuple[Rows, dict[str, list[bytes]], list[bytes], Rows]:
    """Rows every index should hold (-> entity version), the entities that cannot be
    indexed per index, the ids whose bodies cannot be decoded, and the unique rows of
    expired entities (which may be there or not).  ``unread``: add
    the shards whose server is unavailable there (their rows may be incomplete)
    instead of raising ``ShardUnavailable``."""
    topo = store.cluster.current()
    now = time.time()
    indexes = list(indexes)
    expected: Rows = {i.name: {} for i in indexes}
    loose: Rows = {i.name: {} for i in indexes}
    unindexable: dict[str, list[bytes]] = {i.name: [] for i in indexes}
    corrupt: list[bytes] = []
    for shard in range(topo.n_shards):
        for batch in _unless_unavailable(entity_batches(store, topo, shard), shard, unread):
            for _, key, version, body in batch:
                if body is None:
                    continue
                try:
                    entity = store.decode(key, shard, version, body)
                except CorruptEntity:
                    corrupt.append(key)
                    continue
                gone = expired(entity, topo.expire_on, now)
                for index in indexes:
                    held = loose if gone and index.unique else expected
                    try:
                        rows = index.rows(entity)
                    except InvalidEntity:
                        unindexable[index.name].append(key)
                        continue
                    for row in rows:
                        target = shard_of(index.shard_key(row), topo.n_shards)
                        held[index.name][(target, row, key)] = version
    return expected, unindexable, corrupt, loose


def diff_indexes(
    store: DataStore, names: Iterable[str] | None = None, *, partial: bool = False
) -> dict[str, Diff]:
    """Compare the named indexes (default: all maintained ones) with the entities
    (after this process's writes have deleted their stale rows).  A shard that moves
    meanwhile makes it start again on the new map (after waiting for the move).
    ``partial``: the shards of unavailable servers are left ``unverified``."""
    store.flush()
    wanted = set(names) if names is not None else None
    return store.rerouted(lambda: _diff_indexes(store, wanted, partial))


def _diff_indexes(store: DataStore, wanted: set[str] | None, partial: bool) -> dict[str, Diff]:
    topo = store.cluster.refresh()
    indexes = [
        info.index
        for name, info in topo.indexes.items()
        if info.state != IndexState.DROPPED and (wanted is None or name in wanted)
    ]
    unread: set[int] | None = set() if partial else None
    expected, unindexable, _, loose = expected_rows(store, indexes, unread)
    out: dict[str, Diff] = {}
    for index in indexes:
        want = dict(expected[index.name])
        diff = Diff(unindexable=unindexable[index.name])
        skipped = set(unread or ())  # this index's shards not read, and the entities'
        for shard in range(topo.n_shards):
            rows = _unless_unavailable(index_rows(store, topo, shard, index), shard, skipped)
            for values, key, row_version in rows:
                rk = (shard, values, key)
                entity_version = want.pop(rk, None)
                if entity_version is None:
                    if rk not in loose[index.name]:
                        diff.extra[rk] = row_version
                elif row_version < entity_version:
                    diff.behind[rk] = (row_version, entity_version)
        diff.missing = want
        if skipped:
            _forget(diff, skipped, topo.n_shards)
        out[index.name] = diff
    return out


def _unless_unavailable(items: Iterator[T], shard: int, unread: set[int] | None) -> Iterator[T]:
    """``items`` until the shard's server is unavailable: then, with ``unread``, the
    shard is added there and the rest skipped (without, ``ShardUnavailable``)."""
    try:
        yield from items
    except ShardUnavailable:
        if unread is None:
            raise
        unread.add(shard)


def _forget(diff: Diff, unread: set[int], n_shards: int) -> None:
    """Drop the differences the unread shards leave unknown: rows in their index
    tables, and rows of the entities stored on them."""

    def known(key: RowKey) -> bool:
        return key[0] not in unread and shard_of(key[2], n_shards) not in unread

    diff.missing = {k: v for k, v in diff.missing.items() if known(k)}
    diff.extra = {k: v for k, v in diff.extra.items() if known(k)}
    diff.behind = {k: v for k, v in diff.behind.items() if known(k)}
    diff.unverified = sorted(unread)
