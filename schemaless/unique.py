"""Unique indexes: claims, and what a claim that meets another owner does.

docs/architecture.md ("Unique indexes") gives the argument.  ``Claims.claim`` upserts
rows (unique ones with the owner-preserving upsert) and reads back the owners of the
unique ones in the same round trip; ``Claims.settle`` resolves the rows another entity
owns: a live owner that produces the value (and has not expired) is a ``Violation``;
an orphan (its owner absent, a tombstone, or with a body that does not produce it or
has expired, at a version not below the row's) is taken over under the version guard;
an owner in flight (its stored version below the row's) is waited for a little, then
fenced, then taken over.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import failpoints
from .catalog import Topology, now_us
from .cluster import Cluster
from .entity import Entity
from .errors import ConflictError, CorruptEntity, InvalidEntity
from .expiry import expired
from .ids import id_hex
from .owned import guarded
from .scatter import Statement, by_server, ids_by_server
from .writes import (
    IndexRow,
    fence_owner_sql,
    in_transaction,
    owners_sql,
    takeover_sql,
    upserts_sql,
)

__all__ = ["Claims", "Owner", "Violation"]

#: ``(entity_id, entity_version)`` of a unique row; None when there is no row.
Owner = tuple[bytes, int] | None
_Contested = tuple[IndexRow, Owner]
_ROUNDS = 200
_PAUSE = 0.005  # between rounds that only wait for owners in flight


@dataclass(frozen=True, slots=True)
class Violation:
    """A claim that met a live owner producing its value."""

    row: IndexRow
    owner: bytes


class Claims:
    """Claims unique rows for one datastore's writes (and the Cleaner's backfill).

    ``decode(id, shard, version, body)``: the datastore's.  ``wait``: how long an owner
    that looks in flight is given to commit before it is fenced (seconds).
    """

    def __init__(
        self,
        cluster: Cluster,
        decode: Callable[[bytes, int, int, bytes], Entity],
        wait: float = 0.2,
    ) -> None:
        self.cluster = cluster
        self.decode = decode
        self.wait = wait

    def claim(self, topo: Topology, rows: Sequence[IndexRow]) -> list[_Contested]:
        """Step 1: upsert ``rows``, one batch per server, servers in parallel; return
        the unique rows that another entity owns (or that are gone), with that owner."""
        if not rows:
            return []
        reads: dict[int, list[list[IndexRow]]] = {}

        def build(sid: int) -> Statement:
            group = groups[sid]
            stmts, params = upserts_sql(group, topo.dbs, topo.owned_db is not None)
            selects, more, reads[sid] = _owner_reads([r for r in group if r.index.unique], topo)
            shards = [r.shard for r in group]
            return guarded([in_transaction(stmts), *selects], topo.owned_db, shards), [
                *params,
                *more,
            ]

        groups = by_server(topo, rows, _row_shard)
        results = self.cluster.scatter(topo, {sid: sid for sid in groups}, build).results
        return [c for sid, groups_ in reads.items() for c in _contested(groups_, results[sid])]

    def settle(self, topo: Topology, contested: list[_Contested]) -> list[Violation]:
        """Resolve contested claims until each is held or violated; the violations."""
        violations: list[Violation] = []
        since: dict[tuple[bytes, int], float] = {}
        pending = contested
        for _ in range(_ROUNDS):
            if not pending:
                return violations
            states = self._states(topo, {o[0] for _, o in pending if o is not None})
            now = time.monotonic()
            act: list[tuple[IndexRow, Owner]] = []  # claim again (None) or take over
            fence: dict[bytes, tuple[int | None, int]] = {}  # owner -> (seen, up to)
            later: list[_Contested] = []
            for row, owner in pending:
                if owner is None:
                    act.append((row, None))
                    continue
                oid, r = owner
                seen, body = states.get(oid, (None, None))
                if body is not None and self._produces(oid, seen or 0, body, row):
                    violations.append(Violation(row, oid))
                elif (seen or 0) >= r:
                    act.append((row, owner))  # an orphan: take it over
                elif now - since.setdefault(owner, now) < self.wait:
                    later.append((row, owner))  # in flight: give it time to commit
                else:
                    fence[oid] = (seen, max(r, fence.get(oid, (None, 0))[1]))
                    later.append((row, owner))
            if fence:
                failpoints.hit("unique.before_fence")
                fenced = self._fence(topo, fence)
                act += [(row, o) for row, o in later if o is not None and o[0] in fenced]
                later = [(row, o) for row, o in later if o is None or o[0] not in fenced]
            if act:
                failpoints.hit("unique.before_takeover")
                pending = self._act(topo, act) + later
            else:
                pending = later
                time.sleep(_PAUSE)
        row = pending[0][0]
        raise ConflictError(
            f"unique index {row.index.name!r}: the claim of entity {id_hex(row.entity_id)} "
            f"on {row.index.readable(row.values)} did not settle after {_ROUNDS} rounds"
        )

    def _produces(self, owner: bytes, version: int, body: bytes, row: IndexRow) -> bool:
        """Whether the owner's body produces the row and has not expired (on this
        client's clock, as reads decide: an expired owner holds no value); a body that
        cannot be read counts as producing it (a row is never taken from an entity that
        cannot be checked)."""
        shard = self.cluster.shard_of_id(owner)
        try:
            entity = self.decode(owner, shard, version, body)
            prop = self.cluster.topology.expire_on
            return row.values in row.index.rows(entity) and not expired(entity, prop)
        except InvalidEntity:
            return False
        except CorruptEntity:
            return True

    def _states(self, topo: Topology, ids: set[bytes]) -> dict[bytes, tuple[int, bytes | None]]:
        """``id -> (version, body or None for a tombstone)``; absent ids omitted."""
        if not ids:
            return {}
        columns = "`id`, `version`, `body`"
        found = self.cluster.by_id(topo, ids_by_server(topo, ids), columns).results
        out: dict[bytes, tuple[int, bytes | None]] = {}
        for sets in found.values():
            for key, version, body in sets[0]:
                out[bytes(key)] = (int(version), bytes(body) if body is not None else None)
        return out

    def _fence(self, topo: Topology, fences: dict[bytes, tuple[int | None, int]]) -> set[bytes]:
        """Raise each owner to its version if it is still as read; the owners raised."""
        now = now_us()
        stmts: list[tuple[int, bytes, str, list[Any]]] = []
        for owner, (seen, version) in sorted(fences.items()):
            shard = self.cluster.shard_of_id(owner)
            sql, params = fence_owner_sql(
                topo.dbs[shard], owner, seen, version, now, shard if topo.owned_db else None
            )
            stmts.append((shard, owner, sql, params))
        groups = by_server(topo, stmts, _first)
        joined = functools.partial(_joined, topo.owned_db)
        results = self.cluster.scatter(topo, groups, joined, idempotent=False).results
        return {
            owner
            for sid, group in groups.items()
            for (_, owner, _, _), rows in zip(group, results[sid], strict=True)
            if rows[0][0]
        }

    def _act(self, topo: Topology, act: list[tuple[IndexRow, Owner]]) -> list[_Contested]:
        """Claim rows again (no row was there) or take them over (guarded), then read
        their owners back; the rows still held by another."""
        reads: dict[int, list[list[IndexRow]]] = {}

        def build(sid: int) -> Statement:
            group = groups[sid]
            stmts: list[str] = []
            params: list[Any] = []
            claims = [row for row, owner in group if owner is None]
            if claims:
                more_stmts, more = upserts_sql(claims, topo.dbs, topo.owned_db is not None)
                stmts += more_stmts
                params += more
            for row, owner in group:
                if owner is not None:
                    sql, more = takeover_sql(row, topo.dbs[row.shard], *owner)
                    stmts.append(sql)
                    params += more
            selects, more, reads[sid] = _owner_reads([row for row, _ in group], topo)
            shards = [row.shard for row, _ in group]
            sql = guarded([in_transaction(stmts), *selects], topo.owned_db, shards)
            return sql, params + more

        groups = by_server(topo, act, _item_shard)
        results = self.cluster.scatter(
            topo, {sid: sid for sid in groups}, build, idempotent=False
        ).results
        return [c for sid, groups_ in reads.items() for c in _contested(groups_, results[sid])]


def _row_shard(row: IndexRow) -> int:
    return row.shard


def _item_shard(item: _Contested) -> int:
    return item[0].shard


def _first(stmt: tuple[int, bytes, str, list[Any]]) -> int:
    return stmt[0]


def _joined(owned: str | None, group: list[tuple[int, bytes, str, list[Any]]]) -> Statement:
    """The fences of one server: one round trip, one result set each."""
    sql = guarded([s for _, _, s, _ in group], owned, (shard for shard, _, _, _ in group))
    return sql, [p for _, _, _, params in group for p in params]


def _owner_reads(
    rows: list[IndexRow], topo: Topology
) -> tuple[list[str], list[Any], list[list[IndexRow]]]:
    """One owners ``SELECT`` per (logical shard, index) table: the statements, their
    parameters and the rows each one reads."""
    groups: dict[tuple[int, str], list[IndexRow]] = {}
    for row in rows:
        groups.setdefault((row.shard, row.index.name), []).append(row)
    stmts: list[str] = []
    params: list[Any] = []
    ordered: list[list[IndexRow]] = []
    for (shard, _), group in sorted(groups.items()):
        sql, more = owners_sql(topo.dbs[shard], group[0].index, [r.values for r in group])
        stmts.append(sql)
        params += more
        ordered.append(group)
    return stmts, params, ordered


def _contested(groups: list[list[IndexRow]], results: Sequence[Any]) -> list[_Contested]:
    """The rows of ``groups`` whose owner (read in ``results``, one set per group, the
    last ones of the batch) is not their entity."""
    out: list[_Contested] = []
    sets = list(results)[len(results) - len(groups) :] if groups else []
    for group, found in zip(groups, sets, strict=True):
        owners = {tuple(r[:-2]): (bytes(r[-2]), int(r[-1])) for r in found}
        for row in group:
            owner = owners.get(row.values)
            if owner is None or owner[0] != row.entity_id:
                out.append((row, owner))
    return out
