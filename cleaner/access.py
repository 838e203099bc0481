"""Reads and writes of the Cleaner, grouped per server, servers in parallel.

Entities are read raw (tombstones included: a tombstone's version guards deletes);
index rows of a set of entities are found through ``KEY(entity_id)`` (or, the rows a
backfill wrote, by primary key: a building index has no such key yet); upserts use the
write protocol's ``GREATEST`` guard and deletes the Cleaner's ``<=`` guard.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from schemaless.catalog import Topology, now_us
from schemaless.connection import Rows
from schemaless.hashing import shard_of
from schemaless.index import Index
from schemaless.scatter import Statement, by_server, chunks, ids_by_server, rounds, row_bytes
from schemaless.store import DataStore
from schemaless.unique import Owner
from schemaless.writes import IndexRow, upsert_rows_sql

from .sql import (
    Guarded,
    bump_sql,
    delete_guarded_sql,
    fence_sql,
    index_upserts_sql,
    rows_by_entity_sql,
    rows_by_key_sql,
    versions_proof_sql,
)

__all__ = [
    "Found",
    "Stored",
    "bump",
    "delete_rows",
    "fence",
    "placed",
    "read_entities",
    "read_own",
    "read_rows",
    "upsert_grouped",
    "upsert_rows",
    "versions_proof",
]

T = TypeVar("T")

#: Bytes of SQL (roughly) per round trip; far below any max_allowed_packet.
_BATCH_BYTES = 4 * 1024 * 1024
#: Entity ids repeated in one ``rows_by_entity_sql`` statement (ids x shards).
_ID_TERMS = 20_000
#: Rows looked up in one ``rows_by_key_sql`` statement (an ``OR`` of that many keys:
#: well under what the range optimizer plans without a table scan).
_KEY_TERMS = 200


@dataclass(frozen=True, slots=True)
class Stored:
    """An entity row as read: ``body`` None for a tombstone; ``exists`` False (and
    version 0) when there is no row at all."""

    id: bytes
    shard: int
    version: int
    body: bytes | None
    exists: bool = True


@dataclass(frozen=True, slots=True)
class Found:
    """An index row as read."""

    index: Index
    shard: int
    values: tuple[Any, ...]
    entity_id: bytes
    version: int


def placed(
    index: Index, values: tuple[Any, ...], entity_id: bytes, version: int, n_shards: int
) -> IndexRow:
    """An entity's index row on the logical shard its ``shard_on`` value maps to."""
    return IndexRow(index, shard_of(index.shard_key(values), n_shards), values, entity_id, version)


def _rounds(
    store: DataStore,
    topo: Topology,
    batches: Mapping[int, Sequence[Statement]],
    before: Callable[[int], None] | None = None,
) -> dict[int, list[Rows]]:
    return rounds(store.cluster.all_servers(topo).__getitem__, batches, before)


def _chunks(items: Sequence[T], index: Callable[[T], Index]) -> list[list[T]]:
    """Split ``items`` so that each chunk stays under ``_BATCH_BYTES`` of SQL."""
    return list(chunks(list(items), lambda item: row_bytes(index(item)), _BATCH_BYTES))


def read_entities(store: DataStore, topo: Topology, ids: Iterable[bytes]) -> dict[bytes, Stored]:
    """The entity rows of some ids; an id without a row maps to ``exists=False``."""
    wanted = set(ids)
    by_server = ids_by_server(topo, wanted)
    shard_of = {
        key: shard
        for shards in by_server.values()
        for shard, keys in shards.items()
        for key in keys
    }
    found = store.cluster.by_id(topo, by_server, "`id`, `version`, `body`").results
    out: dict[bytes, Stored] = {}
    for sets in found.values():
        for key, version, body in sets[0]:
            k = bytes(key)
            out[k] = Stored(k, shard_of[k], int(version), bytes(body) if body is not None else None)
    for key in wanted - out.keys():
        out[key] = Stored(key, shard_of[key], 0, None, exists=False)
    return out


def read_rows(
    store: DataStore,
    topo: Topology,
    indexes: Sequence[Index],
    ids: Iterable[bytes],
    skip: Container[int] = (),
) -> list[Found]:
    """Every row of these entities in these indexes, on every logical shard (but those
    of the server ids in ``skip``)."""
    keys = sorted(set(ids))
    if not keys or not indexes:
        return []
    batches: dict[int, list[tuple[str, list[Any]]]] = {}
    for sid in topo.servers:
        shards = topo.shards_of(sid)
        if not shards or sid in skip:
            continue
        # the layout of a database per shard repeats the ids in every shard's part
        step = max(1, _ID_TERMS // (1 if topo.owned_db is not None else len(shards)))
        batches[sid] = [
            rows_by_entity_sql(topo.dbs, topo.owned_db, shards, indexes, keys[i : i + step])
            for i in range(0, len(keys), step)
        ]
    out: list[Found] = []
    for results in _rounds(store, topo, batches).values():
        for result_sets in results:
            for index, rows in zip(indexes, result_sets, strict=True):
                for row in rows:
                    out.append(
                        Found(index, int(row[0]), tuple(row[1:-2]), bytes(row[-2]), int(row[-1]))
                    )
    return out


def read_own(
    store: DataStore, topo: Topology, index: Index, groups: Mapping[int, Sequence[tuple[Any, ...]]]
) -> list[Found]:
    """These rows ``(values..., entity_id, ...)`` of one index (grouped by logical
    shard) as they are now, by primary key: those that still exist."""
    batches: dict[int, list[Statement]] = {}
    for shard, rows in sorted(groups.items()):
        for lo in range(0, len(rows), _KEY_TERMS):
            batches.setdefault(topo.shard_servers[shard], []).append(
                rows_by_key_sql(topo.dbs, topo.owned_db, index, shard, rows[lo : lo + _KEY_TERMS])
            )
    n = len(index.columns)
    return [
        Found(index, int(row[0]), tuple(row[1 : n + 1]), bytes(row[n + 1]), int(row[n + 2]))
        for results in _rounds(store, topo, batches).values()
        for result_sets in results
        for row in result_sets[0]
    ]


def upsert_rows(store: DataStore, topo: Topology, rows: Sequence[IndexRow]) -> None:
    """Upsert rows with ``GREATEST(entity_version, version)``, multi-row per table."""
    if not rows:
        return
    batches = {
        sid: [
            upsert_rows_sql(chunk, topo.dbs, topo.owned_db) for chunk in _chunks(group, _row_index)
        ]
        for sid, group in by_server(topo, rows, _row_shard).items()
    }
    _rounds(store, topo, batches)


def upsert_grouped(
    store: DataStore,
    topo: Topology,
    index: Index,
    groups: Mapping[int, list[tuple[Any, ...]]],
    burst: int | None = None,
    pace: Callable[[int], None] | None = None,
) -> list[tuple[IndexRow, Owner]]:
    """Upsert one index's rows ``(values..., entity_id, version)``, grouped by logical
    shard (each group sorted), like ``upsert_rows`` but without an object per row.

    With ``burst``, in transactions of at most that many rows per server (a shard's
    rows then the next's: few tables each), one per server at a time, servers in
    parallel; ``pace(rows)`` is called before each round with the rows it sends.
    For a unique index, the owners are read back in the same round trips: the rows
    that another entity owns (or that are gone) are returned with that owner."""
    step = max(1, _BATCH_BYTES // row_bytes(index))
    if burst is not None:
        step = min(step, burst)
    by_server: dict[int, list[list[tuple[int, list[tuple[Any, ...]]]]]] = {}
    for shard in sorted(groups):
        rows = groups[shard]
        chunks = by_server.setdefault(topo.shard_servers[shard], [[]])
        for lo in range(0, len(rows), step):
            part = rows[lo : lo + step]
            if sum(len(r) for _, r in chunks[-1]) + len(part) > step:
                chunks.append([])
            chunks[-1].append((shard, part))
    for sid in by_server:
        by_server[sid] = [chunk for chunk in by_server[sid] if chunk]
    batches = {
        sid: [index_upserts_sql(topo.dbs, topo.owned_db, index, chunk) for chunk in chunks]
        for sid, chunks in by_server.items()
    }
    results = _rounds(
        store, topo, batches, None if pace is None else partial(_pay, pace, by_server)
    )
    if not index.unique:
        return []
    n = len(index.columns)
    out: list[tuple[IndexRow, Owner]] = []
    for sid, chunks in by_server.items():
        for chunk, sets in zip(chunks, results[sid], strict=True):
            for (shard, rows), found in zip(chunk, sets, strict=True):
                owners = {tuple(r[:n]): (bytes(r[n]), int(r[n + 1])) for r in found}
                for row in rows:
                    owner = owners.get(row[:n])
                    if owner is None or owner[0] != row[n]:
                        out.append((IndexRow(index, shard, row[:n], row[n], row[n + 1]), owner))
    return out


def _pay(
    pace: Callable[[int], None],
    chunks: Mapping[int, Sequence[Sequence[tuple[int, Sequence[Any]]]]],
    n: int,
) -> None:
    """Before round ``n``: ``pace`` the rows of every server's ``n``-th chunk."""
    pace(sum(len(rows) for c in chunks.values() if n < len(c) for _, rows in c[n]))


def versions_proof(
    store: DataStore, topo: Topology, shard: int, runs: Sequence[tuple[int, int]]
) -> tuple[int, int]:
    """``(rows, sum of versions)`` of a shard's entity rows in these ``added_id`` runs."""
    server = store.cluster.server_of_shard(topo, shard)
    count, total = server.run(*versions_proof_sql(topo.dbs, topo.owned_db, shard, runs))[0][0]
    return int(count), int(total)


def _row_index(row: IndexRow) -> Index:
    return row.index


def delete_rows(store: DataStore, topo: Topology, rows: Sequence[Guarded]) -> int:
    """Delete rows where ``entity_version <= guard``; how many were deleted."""
    if not rows:
        return 0
    batches = {
        sid: [
            delete_guarded_sql(topo.dbs, topo.owned_db, chunk)
            for chunk in _chunks(group, _guarded_index)
        ]
        for sid, group in by_server(topo, rows, _guarded_shard).items()
    }
    done = 0
    for results in _rounds(store, topo, batches).values():
        done += sum(int(r[0][0][0] or 0) for r in results)
    return done


def _guarded_index(row: Guarded) -> Index:
    return row[0]


def _guarded_shard(row: Guarded) -> int:
    return row[1]


def _row_shard(row: IndexRow) -> int:
    return row.shard


def fence(
    store: DataStore, topo: Topology, fences: Mapping[bytes, int]
) -> dict[bytes, tuple[int, bool]]:
    """Tombstones of at least ``version`` for absent or dead entities (``id ->
    version``); ``id -> (stored version, is a tombstone)`` afterwards."""
    if not fences:
        return {}
    now = now_us()
    items = [(store.cluster.shard_of_id(key), key, version) for key, version in fences.items()]
    groups = by_server(topo, items, _first)
    batches = {
        sid: [fence_sql(topo.dbs, topo.owned_db, group, now)] for sid, group in groups.items()
    }
    results = _rounds(store, topo, batches)
    out: dict[bytes, tuple[int, bool]] = {}
    for sid, group in groups.items():
        for (_, key, _), rows in zip(sorted(group), results[sid][0], strict=True):
            out[key] = (int(rows[0][0]), bool(rows[0][1]))
    return out


def _first(item: tuple[int, bytes, int]) -> int:
    return item[0]


def bump(store: DataStore, topo: Topology, entity: Stored, version: int) -> bool:
    """Raise a live entity's version (body unchanged) if it is still as read."""
    server = store.cluster.server_of_shard(topo, entity.shard)
    sql, params = bump_sql(
        topo.dbs, topo.owned_db, entity.shard, entity.id, entity.version, version
    )
    return bool(server.run(sql, params)[0][0][0])
