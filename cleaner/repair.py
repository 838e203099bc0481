"""Reconcile index rows with the entities they belong to.

Given entity rows and index rows as read, ``Repairer.reconcile`` upserts the rows the
entity's current body produces (``GREATEST`` with its version) and deletes the others
with the guard ``entity_version <= <version seen>``, so a writer that changed the
entity meanwhile (and upserted its rows with a higher version first) is never undone.

Rows whose version is above the entity's are a write in flight or a writer that died
after step 1.  For an absent entity or a tombstone, they and every other row are fenced
at once: a tombstone at least as high as the rows is written or kept (an in-flight
writer then retries above it), and only then are the rows deleted, with the tombstone's
version as read back.  (A tombstone purged meanwhile may have been followed by a
create at version 1, whose rows a guard from the old tombstone would delete.)  For a
live entity they are left alone until seen again ``fence_after`` seconds later at the
same entity version; then the entity's version is raised to theirs (body unchanged)
and they are deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any

from schemaless import failpoints
from schemaless.catalog import Topology
from schemaless.errors import CorruptEntity, InvalidEntity
from schemaless.hashing import shard_of
from schemaless.ids import id_hex
from schemaless.index import Index
from schemaless.store import DataStore
from schemaless.writes import IndexRow

from .access import (
    Found,
    Stored,
    bump,
    delete_rows,
    fence,
    placed,
    read_entities,
    upsert_rows,
)
from .metrics import Figures
from .sql import Guarded
from .verify import Diff

__all__ = ["Repairer", "produced_rows"]

log = logging.getLogger("schemaless.cleaner")

#: (index name, logical shard, values)
_Key = tuple[str, int, tuple[Any, ...]]
#: Live entities whose rows ran ahead, remembered between passes (bounded).
_AHEAD_MEMORY = 100_000


def produced_rows(
    store: DataStore,
    topo: Topology,
    indexes: Sequence[Index],
    entity: Stored,
    figures: Figures,
) -> dict[Index, set[tuple[Any, ...]]] | None:
    """The rows the entity's current body produces per index (none for a tombstone);
    None if the body cannot be decoded (logged and counted)."""
    if entity.body is None:
        return {index: set() for index in indexes}
    try:
        decoded = store.decode(entity.id, entity.shard, entity.version, entity.body)
    except CorruptEntity as exc:
        log.error("set aside (cannot decode): %s", exc)
        figures.add(corrupt=1)
        return None
    out: dict[Index, set[tuple[Any, ...]]] = {}
    for index in indexes:
        try:
            out[index] = index.rows(decoded)
        except InvalidEntity as exc:
            log.warning(
                "set aside for index %r (values do not fit): entity %s on logical shard %d: %s",
                index.name,
                id_hex(entity.id),
                entity.shard,
                exc,
            )
            figures.add(unindexable=1)
            out[index] = set()
    return out


class Repairer:
    """Applies the Cleaner's guards; remembers rows that ran ahead of live entities."""

    def __init__(
        self,
        store: DataStore,
        figures: Figures,
        *,
        fence_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.figures = figures
        self.fence_after = fence_after
        self._clock = clock
        self._ahead: dict[bytes, tuple[int, float]] = {}  # id -> (entity version, first seen)

    def reconcile(
        self,
        topo: Topology,
        indexes: Sequence[Index],
        entities: Mapping[bytes, Stored],
        found: Iterable[Found],
        *,
        add_missing: bool,
        skip: Container[int] = (),
    ) -> bool:
        """Make the ``found`` rows agree with ``entities`` (read after or before them,
        either is safe); with ``add_missing``, also upsert rows that were not found.
        Rows to upsert on the server ids in ``skip`` are left out; whether none was."""
        n = topo.n_shards
        wanted: dict[bytes, set[_Key]] = {}
        for key, entity in entities.items():
            rows = produced_rows(self.store, topo, indexes, entity, self.figures)
            if rows is not None:
                wanted[key] = {
                    (index.name, shard_of(index.shard_key(row), n), row)
                    for index, produced in rows.items()
                    for row in produced
                }
        by_name = {index.name: index for index in indexes}
        upserts: list[IndexRow] = []
        deletes: list[Guarded] = []
        ahead: dict[bytes, list[Found]] = {}
        seen: set[tuple[bytes, _Key]] = set()
        for row in found:
            produced = wanted.get(row.entity_id)
            if produced is None:
                continue  # not read, or undecodable: leave its rows alone
            entity = entities[row.entity_id]
            row_key: _Key = (row.index.name, row.shard, row.values)
            seen.add((row.entity_id, row_key))
            if row_key in produced:
                if row.version < entity.version:
                    upserts.append(
                        IndexRow(row.index, row.shard, row.values, row.entity_id, entity.version)
                    )
            elif row.version <= entity.version and entity.body is not None:
                deletes.append((row.index, row.shard, row.values, row.entity_id, entity.version))
            else:  # ahead of its entity, or of a tombstone that may be purged meanwhile
                ahead.setdefault(row.entity_id, []).append(row)
        if add_missing:
            for entity_id, keys in wanted.items():
                version = entities[entity_id].version
                for name, shard, values in keys:
                    if (entity_id, (name, shard, values)) not in seen:
                        upserts.append(IndexRow(by_name[name], shard, values, entity_id, version))
        complete = self._upsert(topo, upserts, skip)
        failpoints.hit("cleaner.before_delete")
        fenced, complete_fence = self._fence(topo, entities, ahead, skip)
        deletes += fenced
        if deletes:
            self.figures.add(orphans_deleted=delete_rows(self.store, topo, deletes))
        return complete and complete_fence

    def _upsert(self, topo: Topology, rows: list[IndexRow], skip: Container[int] = ()) -> bool:
        """Upsert the rows but those on the server ids in ``skip``; whether none was."""
        kept = [row for row in rows if topo.shard_servers[row.shard] not in skip]
        if kept:
            upsert_rows(self.store, topo, kept)
            self.figures.add(rows_upserted=len(kept))
        return len(kept) == len(rows)

    def _fence(
        self,
        topo: Topology,
        entities: Mapping[bytes, Stored],
        ahead: dict[bytes, list[Found]],
        skip: Container[int] = (),
    ) -> tuple[list[Guarded], bool]:
        """Deletes made safe by fencing rows that ran ahead of their entity, and
        whether no upsert was left out (``skip``)."""
        out: list[Guarded] = []
        complete = True
        dead = {
            k: max(entities[k].version, *(r.version for r in rows))
            for k, rows in ahead.items()
            if entities[k].body is None
        }
        for key, (version, tombstone) in fence(self.store, topo, dead).items():
            if tombstone and version >= dead[key]:
                self.figures.add(fenced=1)
                out += [(r.index, r.shard, r.values, key, version) for r in ahead[key]]
            else:
                log.info("entity %s came alive while being fenced; next pass", id_hex(key))
        now = self._clock()
        for key, rows in ahead.items():
            entity = entities[key]
            if entity.body is None:
                continue
            if now - self._first_seen(key, entity.version, now) < self.fence_after:
                self.figures.add(deferred=len(rows))
                continue
            version = max(r.version for r in rows)
            # its rows in every index are to carry the raised version
            produced = produced_rows(self.store, topo, topo.maintained(), entity, self.figures)
            rows_now = [
                placed(index, row, key, version, topo.n_shards)
                for index, values in (produced or {}).items()
                for row in values
            ]
            if any(topo.shard_servers[r.shard] in skip for r in rows_now):
                complete = False  # not raised while one of them cannot follow
                continue
            self._ahead.pop(key, None)
            if not bump(self.store, topo, entity, version):
                continue  # the entity changed: a later pass sees its new version
            self.figures.add(fenced=1)
            self._upsert(topo, rows_now)
            out += [(r.index, r.shard, r.values, key, version) for r in rows]
        return out, complete

    def _first_seen(self, key: bytes, version: int, now: float) -> float:
        """When rows ahead of this entity at this version were first seen (now if not)."""
        first = self._ahead.get(key)
        if first is not None and first[0] == version:
            return first[1]
        if len(self._ahead) >= _AHEAD_MEMORY:  # forget the oldest sightings
            horizon = now - 10 * max(self.fence_after, 1.0)
            self._ahead = {k: v for k, v in self._ahead.items() if v[1] >= horizon}
        if len(self._ahead) < _AHEAD_MEMORY:
            self._ahead[key] = (version, now)
        return now

    def repair_diff(self, topo: Topology, diffs: Mapping[str, Diff]) -> None:
        """Fix what ``verify.diff_indexes`` found: upsert missing and behind rows, and
        reconcile extra rows with their entities (read again now)."""
        upserts: list[IndexRow] = []
        extras: list[Found] = []
        indexes = [topo.indexes[name].index for name in diffs if name in topo.indexes]
        for index in indexes:
            diff = diffs[index.name]
            for (shard, values, key), version in diff.missing.items():
                upserts.append(IndexRow(index, shard, values, key, version))
            for (shard, values, key), (_, version) in diff.behind.items():
                upserts.append(IndexRow(index, shard, values, key, version))
            for (shard, values, key), version in diff.extra.items():
                extras.append(Found(index, shard, values, key, version))
        self._upsert(topo, upserts)
        if extras:
            entities = read_entities(self.store, topo, {r.entity_id for r in extras})
            self.reconcile(topo, indexes, entities, extras, add_missing=False)
