"""The write protocol: index rows first, the entity second, stale rows last (queued).

docs/architecture.md explains why each step is safe.  ``Writer.write`` runs steps 1-3
(step 1 settling the claims of unique indexes, ``schemaless.unique``)
for a batch of entities (one statement batch per server per step, servers in
parallel), again with larger versions for those whose stored version was ahead;
``Writer.delete`` writes tombstones and queues the old bodies' rows for deletion
(``self.stale``, in the background).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import failpoints
from .catalog import IndexState, Topology
from .clock import VersionClock
from .cluster import Cluster
from .codec import Codec
from .counts import entity_keys
from .entity import Entity
from .errors import (
    ConflictError,
    CorruptEntity,
    InvalidEntity,
    SchemalessError,
    UniqueViolation,
)
from .hashing import shard_of
from .ids import id_hex, new_id, to_id
from .index import Index
from .scatter import STATEMENT_BYTES, Statement, by_server, chunks, sql_bytes
from .stale import StaleRows
from .unique import Claims, Violation
from .writes import (
    BLIND,
    CREATE,
    NEW,
    EntityWrite,
    IndexRow,
    PreparedWrite,
    WriteMode,
    delete_rows_sql,
    entity_batch_sql,
    fires,
    release_sql,
    upsert_rows_sql,
    write_position,
)

__all__ = ["Writer"]

log = logging.getLogger(__name__)

_BLIND_ATTEMPTS = 8
_DELETE_BYTES = 2 * STATEMENT_BYTES  # at most the SQL of one tombstone's statements


@dataclass(frozen=True)
class Outcome:
    """What step 2 did to one entity."""

    applied: bool
    old_body: bytes | None  # the live body read just before (when indexes need it)
    stored: int | None  # the version stored after the write (None: no row)
    alive: bool  # the row after the write is a live entity (not a tombstone)


def _conflict(key: bytes, mode: WriteMode, out: Outcome) -> ConflictError:
    current = out.stored if out.alive else None
    expected = mode.expected
    return ConflictError(
        f"entity {id_hex(key)}: expected version {expected}, stored version is "
        f"{current if current is not None else 'absent'}",
        current_version=current,
    )


def _write_bytes(prepared: PreparedWrite, counted: bool = False) -> int:
    """At most the SQL of one entity's write: its statements, its body and its index
    rows (a statement each); ``counted``: its count statements, each naming every key
    (at most one per prefix of each row, 16 bytes written as 35)."""
    rows = [row for group in prepared.rows.values() for row in group]
    keys = sum(len(row) + 1 for row in rows) if counted else 0
    return (
        (7 if counted else 2) * STATEMENT_BYTES
        + 4 * 40 * keys
        + sql_bytes((prepared.body,))
        + sum(STATEMENT_BYTES + sql_bytes(row) for row in rows)
    )


def _shown(index: Index, values: tuple[Any, ...]) -> str:
    """``name='ada'``: a unique value for a message."""
    return ", ".join(f"{k}={v!r}" for k, v in index.readable(values).items())


def _violation(v: Violation) -> UniqueViolation:
    index = v.row.index
    shown = _shown(index, v.row.values)
    return UniqueViolation(
        f"unique index {index.name!r}: {shown} belongs to another entity "
        f"(entity {id_hex(v.row.entity_id)} was not written)",
        index=index.name,
        values=v.row.values,
    )


def _check_unique(
    topo: Topology, indexes: list[Index], prepared: list[PreparedWrite]
) -> list[tuple[Index, bytes, SchemalessError]]:
    """Refuse a batch in which two entities produce one value of a unique index; of a
    building one, the later entity's row is left out instead, and returned to block
    the index with: ``(index, entity id, the error if it cannot be blocked)``."""
    blocks: list[tuple[Index, bytes, SchemalessError]] = []
    for index in indexes:
        if not index.unique:
            continue
        owner: dict[tuple[Any, ...], bytes] = {}
        for p in prepared:
            for values in list(p.rows[index.name]):
                other = owner.setdefault(values, p.entity_id)
                if other != p.entity_id:
                    exc = UniqueViolation(
                        f"unique index {index.name!r}: entities {id_hex(other)} and "
                        f"{id_hex(p.entity_id)} of one put_many both have {_shown(index, values)};"
                        " nothing was written",
                        index=index.name,
                        values=values,
                    )
                    if not _building(topo, index):
                        raise exc
                    p.rows[index.name].discard(values)
                    blocks.append((index, p.entity_id, exc))
    return blocks


def _building(topo: Topology, index: Index) -> bool:
    info = topo.indexes.get(index.name)
    return info is not None and info.state == IndexState.BUILDING


class Writer:
    """Runs the write protocol for one datastore."""

    def __init__(
        self,
        cluster: Cluster,
        codec: Codec,
        clock: VersionClock,
        decode: Callable[[bytes, int, int, bytes], Entity],
    ) -> None:
        self.cluster = cluster
        self.codec = codec
        self.clock = clock
        self.decode = decode
        self.stale = StaleRows(self._remove_stale)
        self.claims = Claims(cluster, decode)
        self._blocked: set[tuple[str, int]] = set()  # (index, epoch) this process blocked

    def write(self, entities: list[Mapping[str, Any]], mode: WriteMode) -> list[int]:
        """Validate everything, then run steps 1-3; return the versions."""
        if not entities:
            return []
        topo = self.cluster.current()
        indexes = topo.maintained()
        prepared: list[PreparedWrite] = []
        seen: set[bytes] = set()
        fresh: set[bytes] = set()  # ids made here: no live row before, nothing for step 3
        blocks: list[tuple[Index, bytes, SchemalessError]] = []  # building indexes met
        for entity in entities:
            if not isinstance(entity, Mapping):
                raise InvalidEntity(f"an entity must be a dict, got {type(entity).__name__}")
            if "id" not in entity:
                if not isinstance(entity, dict):
                    raise InvalidEntity("an entity without 'id' must be a dict to receive one")
                entity["id"] = new_id()
                fresh.add(entity["id"])
            key = to_id(entity["id"])
            if key in seen:
                raise InvalidEntity(f"entity {id_hex(key)} appears twice in one put_many")
            seen.add(key)
            try:
                body = self.codec.encode(entity)
                rows = {index.name: _rows(topo, index, key, entity, blocks) for index in indexes}
            except InvalidEntity as exc:
                raise type(exc)(f"entity {id_hex(key)}: {exc}") from exc
            prepared.append(PreparedWrite(key, self.cluster.shard_of_id(key), body, rows))
        blocks += _check_unique(topo, indexes, prepared)
        for index, key, error in blocks:  # before any row or entity is written
            if not self._block(topo, index, key, error):
                raise error
        versions: dict[bytes, int] = {}
        size = functools.partial(_write_bytes, counted=bool(topo.counted))
        for pending in chunks(prepared, size, self.cluster.max_batch_bytes):
            for attempt in range(_BLIND_ATTEMPTS):
                pending = self._attempt(topo, indexes, pending, mode, versions, fresh, attempt == 0)
                if not pending:
                    break
            else:
                raise ConflictError(
                    f"entity {id_hex(pending[0].entity_id)}: stored version kept moving ahead "
                    f"after {_BLIND_ATTEMPTS} attempts"
                )
        return [versions[p.entity_id] for p in prepared]

    def _attempt(
        self,
        topo: Topology,
        indexes: list[Index],
        prepared: list[PreparedWrite],
        mode: WriteMode,
        versions: dict[bytes, int],
        fresh: set[bytes],
        first: bool,
    ) -> list[PreparedWrite]:
        """One pass of steps 1-3; return the entities to write again with a new V.

        An id made here is a plain INSERT the first time (``NEW``); if that met a row
        (the Cleaner's tombstone over rows that step 1 wrote ahead of it), it is written
        again only over a tombstone (``CREATE``), never over a live entity.
        """
        by_name = {index.name: index for index in indexes}
        writes, new_rows, local = self._place(topo, by_name, prepared, mode, versions, fresh, first)
        failpoints.hit("put.before_index_rows")
        self._claim(topo, new_rows, fresh)
        failpoints.hit("put.after_index_rows")
        outcomes = self._run_entities(topo, writes, local)
        failpoints.hit("put.after_entity")
        again = []
        stale_rows: list[IndexRow] = []
        for p in prepared:
            key = p.entity_id
            out = outcomes[key]
            if out.applied:
                if out.old_body is not None:
                    stale_rows += self._stale_rows(
                        topo, by_name, key, p.shard, out.old_body, p.rows, versions[key]
                    )
                continue
            if out.stored is not None:
                self.clock.observe(out.stored)
            if key in fresh:
                if out.alive:  # a random collision: that entity is left alone
                    raise ConflictError(
                        f"entity {id_hex(key)}: duplicate key, the id made for it is taken "
                        f"(stored version {out.stored}); that entity is left alone",
                        current_version=out.stored,
                    )
                if out.stored is not None:
                    versions[key] = out.stored
                again.append(p)
            elif mode is BLIND:
                again.append(p)
            elif mode is CREATE and not out.alive and out.stored is not None:
                versions[key] = out.stored  # a tombstone: create above its version
                again.append(p)
            else:
                raise _conflict(key, mode, out)
        if stale_rows:
            self.stale.submit(stale_rows)
            failpoints.hit("put.after_stale_rows")
        return again

    def _place(
        self,
        topo: Topology,
        by_name: dict[str, Index],
        prepared: list[PreparedWrite],
        mode: WriteMode,
        versions: dict[bytes, int],
        fresh: set[bytes],
        first: bool,
    ) -> tuple[list[EntityWrite], list[IndexRow], dict[int, list[IndexRow]]]:
        """Each entity's new version and step 2, and its index rows: those of step 1,
        and (by server) those that commit with their entity in step 2."""
        dbs = topo.dbs
        now = self.clock.next()
        writes: list[EntityWrite] = []
        new_rows: list[IndexRow] = []  # step 1: rows on other servers than their entity
        local: dict[int, list[IndexRow]] = {}  # the others join step 2 on their server
        for p in prepared:
            key, shard = p.entity_id, p.shard
            if mode is BLIND:
                version = self.clock.next()
            elif mode is CREATE:
                version = max(versions.get(key, 0) + 1, 1)
            else:
                version = mode.expected + 1
            versions[key] = version
            kind = (NEW if first else CREATE) if key in fresh else mode
            want_body = bool(by_name) and key not in fresh
            keys = entity_keys(topo, p.rows)
            writes.append(
                EntityWrite(dbs[shard], shard, key, version, now, p.body, kind, want_body, keys)
            )
            home = topo.shard_servers[shard]
            for name, values in p.rows.items():
                index = by_name[name]
                for row in values:
                    target = self._row_shard(topo, index, row)
                    placed = IndexRow(index, target, row, key, version)
                    # commits with its entity; a unique claim is settled before step 2
                    if not index.unique and topo.shard_servers[target] == home:
                        local.setdefault(home, []).append(placed)
                    else:
                        new_rows.append(placed)
        return writes, new_rows, local

    def _claim(self, topo: Topology, rows: list[IndexRow], fresh: set[bytes]) -> None:
        """Step 1; unique rows that another entity owns are settled before step 2 (a
        violation raises, and the rows of new entities are released at once)."""
        if not any(row.index.unique for row in rows):
            self._run_rows(topo, rows, topo.dbs, upsert_rows_sql)
            return
        found = self.claims.settle(topo, self.claims.claim(topo, rows))
        violations = [
            v for v in found if not self._block(topo, v.row.index, v.row.entity_id, _violation(v))
        ]
        if not violations:
            return
        released = [r for r in rows if r.index.unique and r.entity_id in fresh]
        try:
            self._run_rows(topo, released, topo.dbs, release_sql)
        except SchemalessError as exc:  # orphans: the next claimer takes them over
            log.warning("unique rows of a refused put left as orphans: %s", exc)
        raise _violation(violations[0])

    def _block(self, topo: Topology, index: Index, key: bytes, exc: SchemalessError) -> bool:
        """Whether a write may go on without its rows of ``index``: the index is
        building, and blocked from becoming ready (in the catalog, before the entity is
        written; once per index epoch and process).  False: it is ready (or no
        longer building), and the write is refused as for a ready index."""
        if not _building(topo, index):
            return False
        mark = (index.name, topo.index_epoch)
        if mark in self._blocked:
            return True
        failpoints.hit("put.before_block")
        shown = id_hex(key)
        example = {"entity_id": shown, "why": str(exc).removeprefix(f"entity {shown}: ")}
        if not self.cluster.catalog.block_index(index.name, example):
            return False
        log.warning("index %r cannot become ready: %s", index.name, exc)
        self._blocked.add(mark)
        failpoints.hit("put.after_block")
        return True

    def _remove_stale(self, rows: list[IndexRow]) -> None:
        """Step 3 (run by ``self.stale``), on the current topology.  The writes are
        already committed: if a server cannot be reached, the stale rows stay as orphans
        (filtered by queries, removed by the Cleaner)."""
        topo = self.cluster.current()
        try:
            self._run_rows(topo, rows, topo.dbs, delete_rows_sql)
        except SchemalessError as exc:  # unreachable, or the shard is moving
            log.warning("stale index rows left for the Cleaner: %s", exc)

    def _stale_rows(
        self,
        topo: Topology,
        by_name: dict[str, Index],
        key: bytes,
        shard: int,
        old_body: bytes,
        new_rows: dict[str, set[tuple[Any, ...]]],
        version: int,
    ) -> list[IndexRow]:
        """Rows the old body produced that the new one does not (step 3)."""
        try:
            old = self.decode(key, shard, 0, old_body)
        except CorruptEntity:
            log.warning(
                "entity %s: old body undecodable; stale rows left to the Cleaner", id_hex(key)
            )
            return []
        out = []
        for name, index in by_name.items():
            try:
                old_rows = index.rows(old)
            except InvalidEntity:
                continue  # never indexed: nothing to remove
            for row in old_rows - new_rows.get(name, set()):
                out.append(IndexRow(index, self._row_shard(topo, index, row), row, key, version))
        return out

    def delete(self, keys: list[bytes], mode: WriteMode) -> int:
        """Write tombstones, then queue the old bodies' rows; return how many existed."""
        counted = bool(self.cluster.current().counted)
        step = self.cluster.max_batch_bytes // (_DELETE_BYTES + 3 * STATEMENT_BYTES * counted)
        return sum(self._delete(keys[i : i + step], mode) for i in range(0, len(keys), step))

    def _delete(self, keys: list[bytes], mode: WriteMode) -> int:
        topo = self.cluster.current()
        indexes = topo.maintained()
        by_name = {index.name: index for index in indexes}
        dbs = topo.dbs
        shards = {key: self.cluster.shard_of_id(key) for key in keys}
        tombstone_keys = entity_keys(topo, {})  # a tombstone contributes no key
        deleted = 0
        stale: list[IndexRow] = []
        pending = keys
        for _ in range(_BLIND_ATTEMPTS):
            now = self.clock.next()
            writes = [
                EntityWrite(
                    dbs[shards[key]],
                    shards[key],
                    key,
                    self.clock.next() if mode is BLIND else mode.expected + 1,
                    now,
                    None,
                    mode,
                    bool(indexes),
                    tombstone_keys,
                )
                for key in pending
            ]
            failpoints.hit("delete.before_entity")
            outcomes = self._run_entities(topo, writes)
            failpoints.hit("delete.after_entity")
            again = []
            for key in pending:
                out = outcomes[key]
                if out.applied:
                    deleted += 1
                    assert out.stored is not None
                    if out.old_body is not None:
                        stale += self._stale_rows(
                            topo, by_name, key, shards[key], out.old_body, {}, out.stored
                        )
                elif mode is not BLIND:
                    raise _conflict(key, mode, out)
                elif out.alive and out.stored is not None:
                    self.clock.observe(out.stored)  # a clock behind the stored version
                    again.append(key)
            pending = again
            if not pending:
                break
        if stale:
            self.stale.submit(stale)
        if pending:
            raise ConflictError(
                f"entity {id_hex(pending[0])}: stored version kept moving ahead "
                f"after {_BLIND_ATTEMPTS} attempts"
            )
        return deleted

    def _row_shard(self, topo: Topology, index: Index, row: tuple[Any, ...]) -> int:
        return shard_of(index.shard_key(row), topo.n_shards)

    def _run_rows(
        self,
        topo: Topology,
        rows: list[IndexRow],
        dbs: Sequence[str],
        build: Callable[[list[IndexRow], Sequence[str], str | None], tuple[str, list[Any]]],
    ) -> None:
        """Steps 1 and 3: one idempotent batch per server, servers in parallel."""
        if rows:
            groups = by_server(topo, rows, _row_shard)
            owned = topo.owned_db
            self.cluster.scatter(topo, groups, lambda group: build(group, dbs, owned))

    def _run_entities(
        self,
        topo: Topology,
        writes: list[EntityWrite],
        local: Mapping[int, list[IndexRow]] | None = None,
    ) -> dict[bytes, Outcome]:
        """Step 2 (with ``local``: index rows upserted in the same transaction, per
        server): what happened to each entity.

        A write that applied is known from its affected-row count; only for those that
        did not (a conflict, a clock behind, an absent entity) is the stored state read.
        So it is for every write of a server whose transaction a NEW write's INSERT
        ended: the id was taken, in practice by the Cleaner's tombstone over the rows
        that step 1 wrote ahead of it, and the server rolled the whole batch back.

        In the owned layout a batch is first sent ``tentative`` (no check): a write that
        applied proved its shard owned through the triggers.  A compare-and-set that may
        match no row and did not apply is sent again checked (with its local rows,
        idempotent), whose answer alone is taken; a blind delete that did not apply
        changed nothing, and the stored state read below (checked, in one snapshot) is
        its answer at that instant (docs/architecture.md, "The check").
        """
        owned = topo.owned_db is not None
        out, missed = self._send_entities(topo, writes, local, owned)
        if missed:
            failpoints.hit("write.before_checked")
        unsure = [w for _, w in missed if not fires(w) and w.mode is not BLIND] if owned else []
        if unsure:
            ids = {w.entity_id for w in unsure}
            rows = {sid: [r for r in rs if r.entity_id in ids] for sid, rs in (local or {}).items()}
            again, missed_again = self._send_entities(topo, unsure, rows, False)
            out.update(again)
            missed = [(sid, w) for sid, w in missed if w.entity_id not in ids] + missed_again
        if missed:
            refused: dict[int, dict[int, list[bytes]]] = {}
            for sid, w in missed:
                refused.setdefault(sid, {}).setdefault(w.shard, []).append(w.entity_id)
            for key, (version, alive) in self._states(refused).items():
                out[key] = Outcome(False, None, version, alive)
        return out

    def _send_entities(
        self,
        topo: Topology,
        writes: list[EntityWrite],
        local: Mapping[int, list[IndexRow]] | None,
        tentative_ok: bool,
    ) -> tuple[dict[bytes, Outcome], list[tuple[int, EntityWrite]]]:
        """One step 2 batch per server, servers in parallel: each write's outcome, and
        the writes that did not apply with their server."""
        groups = by_server(topo, writes, _write_shard)
        firsts: dict[int, int] = {}

        def build(sid: int) -> Statement:
            rows = local.get(sid, []) if local else []
            sql, params, firsts[sid] = entity_batch_sql(
                groups[sid], rows, topo.dbs, topo.fence, topo.changes, topo.owned_db, tentative_ok
            )
            return sql, params

        results, errors, counts = self.cluster.scatter(
            topo, {sid: sid for sid in groups}, build, partial=True, commits=True
        )
        out: dict[bytes, Outcome] = {}
        missed: list[tuple[int, EntityWrite]] = []
        for sid, error in errors.items():
            if not isinstance(error, ConflictError) or all(w.mode is not NEW for w in groups[sid]):
                raise error
            for w in groups.pop(sid):
                out[w.entity_id] = Outcome(False, None, None, False)
                missed.append((sid, w))
        for sid, group in groups.items():
            sets, done, first = results[sid], counts[sid], firsts[sid]
            ordered = sorted(group, key=lambda w: (w.shard, w.entity_id))
            pos = 0
            for n, w in enumerate(ordered):
                body = None
                if w.want_body:
                    before, pos = sets[pos], pos + 1
                    body = before[0][0] if before else None
                applied = done[write_position(first, n, ordered)] > 0
                out[w.entity_id] = Outcome(
                    applied=applied,
                    old_body=bytes(body) if body is not None else None,
                    stored=w.version if applied else None,
                    alive=applied and w.body is not None,
                )
                if not applied:
                    missed.append((sid, w))
        return out, missed

    def _states(self, keys: dict[int, dict[int, list[bytes]]]) -> dict[bytes, tuple[int, bool]]:
        """The stored ``(version, alive)`` of entities, by server and logical shard
        (absent ones omitted)."""
        topo = self.cluster.current()
        columns = "`id`, `version`, `body` IS NULL"
        rows = self.cluster.by_id(topo, keys, columns).results
        return {bytes(r[0]): (int(r[1]), not r[2]) for sets in rows.values() for r in sets[0]}


def _rows(
    topo: Topology,
    index: Index,
    key: bytes,
    entity: Mapping[str, Any],
    blocks: list[tuple[Index, bytes, SchemalessError]],
) -> set[tuple[Any, ...]]:
    """The rows of ``entity`` for ``index``; none for a value that does not fit a
    building index (added to ``blocks``; the error names the entity)."""
    try:
        return index.rows(entity)
    except InvalidEntity as exc:
        if not _building(topo, index):
            raise
        blocks.append((index, key, type(exc)(f"entity {id_hex(key)}: {exc}")))
        return set()


def _row_shard(row: IndexRow) -> int:
    return row.shard


def _write_shard(write: EntityWrite) -> int:
    return write.shard
