"""The read path: entities by id, fetched from their servers and decoded."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from .catalog import Topology
from .cluster import Cluster
from .codec import Codec
from .entity import Entity
from .errors import CorruptEntity, TableMissing
from .expiry import expired
from .follow import Calls
from .ids import id_hex
from .names import quote
from .owned import CHECK, shards_sql
from .scatter import ID_BYTES, bare, ids_by_server, server_reads, unreachable_only
from .schema import shard_db

__all__ = ["Reader"]

_COLUMNS = "`id`, `version`, `body`"


class Reader:
    """Fetches entities by id and decodes them."""

    def __init__(self, cluster: Cluster, codec: Codec, calls: Calls) -> None:
        self.cluster = cluster
        self.codec = codec
        self.calls = calls

    def get(self, key: bytes, consistency: str) -> Entity | None:
        """One entity, or None (absent, a tombstone, or expired)."""
        entity = self.stored(key, consistency)
        if entity is None or expired(entity, self.cluster.topology.expire_on):
            return None
        return entity

    def stored(self, key: bytes, consistency: str) -> Entity | None:
        """The stored entity, expired or not; None if absent or deleted."""
        topo = self.cluster.current()
        shard = self.cluster.shard_of_id(key)
        server = self.cluster.reader(topo, topo.shard_servers[shard], consistency)
        if topo.owned_db is None:
            rows = server.run(_get_sql(topo.dbs[shard]), (key,))[0]
        else:  # the shard's owned row, then the entity's columns: none if it moved
            rows = server.run(_owned_get_sql(topo.owned_db, shard), (key,))[0]
            if not rows:
                raise TableMissing(f"{server.name}: logical shard {shard} is not here (moved)")
        if not rows or rows[0][1] is None:  # absent, or a tombstone
            return None
        return self.decode(key, shard, rows[0][0], rows[0][1])

    def get_many(self, keys: Sequence[bytes], consistency: str) -> list[Entity | None]:
        """Entities in order (None where absent): one statement per server, more when
        the ids would not fit in the servers' max_allowed_packet; each part follows
        the map on its own."""
        unique = list(set(keys))
        step = self.cluster.max_batch_bytes // ID_BYTES
        found: dict[bytes, Entity] = {}
        for start in range(0, len(unique), step):
            part = set(unique[start : start + step])
            found.update(self.calls.rerouted(functools.partial(self.fetch, part, consistency))[0])
        return [found.get(k) for k in keys]

    def fetch(
        self, ids: set[bytes], consistency: str = "primary", *, partial: bool = False
    ) -> tuple[dict[bytes, Entity], set[int]]:
        """Live entities by id, one statement per server; with ``partial``, the logical
        shards whose server did not answer instead of an error."""
        if not ids:
            return {}, set()
        topo = self.cluster.current()
        by_server = ids_by_server(topo, ids)
        results, errors, _ = self.cluster.by_id(
            topo, by_server, _COLUMNS, consistency=consistency, partial=partial
        )
        missing: set[int] = set()
        if errors:
            unreachable_only(errors)
            missing = {shard for sid in errors for shard in by_server[sid]}
        out: dict[bytes, Entity] = {}
        for sets in results.values():
            for key, version, body in sets[0]:
                if body is not None:  # a tombstone otherwise
                    entity = self.decode(key, None, version, body)
                    if not expired(entity, topo.expire_on):
                        out[key] = entity
        return out, missing

    def newest(self, samples: int) -> list[Entity]:
        """About ``samples`` live entities, the newest (``newest_reads``), one
        statement per server."""
        topo = self.cluster.refresh()
        found = self.cluster.scatter(topo, newest_reads(topo, samples), bare).results
        return [
            self.decode(bytes(r[1]), int(r[0]), int(r[2]), bytes(r[3]))
            for rows in found.values()
            for r in rows[0]
        ]

    def decode(self, entity_id: bytes, shard: int | None, version: int, body: bytes) -> Entity:
        """Decode a stored body, naming the entity and its shard (found from the id when
        None) on failure."""
        try:
            try:
                return Entity(self.codec.decode(body), int(version))
            except CorruptEntity:
                dict_id = self.codec.dictionary_id(body)
                if dict_id is None or self.codec.has_dictionary(dict_id):
                    raise
                self.cluster.refresh()  # a dictionary trained since the last refresh
                return Entity(self.codec.decode(body), int(version))
        except CorruptEntity as exc:
            if shard is None:
                shard = self.cluster.shard_of_id(entity_id)
            raise CorruptEntity(
                f"entity {id_hex(entity_id)} on logical shard {shard} "
                f"({shard_db(self.cluster.topology.prefix, shard)}): {exc}"
            ) from exc


def newest_reads(topo: Topology, samples: int) -> dict[int, str]:
    """Per server, a read of about ``samples`` live entities in all, the newest
    (``shard, id, version, body``): of each logical shard as many (at least one), or
    in the owned layout of each server its shards' share, read down ``KEY by_added``
    (a range over the shards would read and sort all their rows)."""
    per = max(1, -(-samples // topo.n_shards))
    columns = "`id`, `version`, `body`"

    def newest(table: str, where: str, n: int) -> str:
        return f"FROM {table} WHERE {where}`body` IS NOT NULL ORDER BY `added_id` DESC LIMIT {n}"

    return server_reads(
        topo,
        lambda db, shards: (
            f"SELECT `shard`, {columns} "
            + newest(
                f"{quote(db, 'entities')} FORCE INDEX (`by_added`)",
                f"{shards_sql(shards)} AND ",
                per * len(shards),
            )
        ),
        lambda s: f"(SELECT {int(s)}, {columns} {newest(quote(topo.dbs[s], 'entities'), '', per)})",
    )


@functools.lru_cache(maxsize=65536)
def _get_sql(db: str) -> str:
    # Tombstones are skipped by the caller: `AND body IS NOT NULL` here cost the
    # server 8-20 µs per call (measured against the same SELECT without it).
    return f"SELECT `version`, `body` FROM {quote(db, 'entities')} WHERE `id` = %s"


@functools.lru_cache(maxsize=65536)
def _owned_get_sql(db: str, shard: int) -> str:
    """A point read that is its own ownership check: one row (the entity's version and
    body, NULL if absent) if the shard is owned, none if not.  The check as a second
    statement (``owned.check_sql``) doubled a get's server CPU (bench/guardcost.py)."""
    return (
        f"SELECT {CHECK} e.`version`, e.`body` FROM {quote(db, 'owned')} o"
        f" LEFT JOIN {quote(db, 'entities')} e ON e.`id` = %s WHERE o.`shard` = {int(shard)}"
    )
