"""The catalog's snapshot: where every logical shard lives, and the indexes.

``Catalog.load`` reads it in one round trip; clients route by it until the next
refresh.  Values only: nothing here talks to a server.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from .dsn import Address
from .index import Index
from .owned import DATABASES, OWNED, Shards, data_db
from .schema import fence_table, shard_db

__all__ = ["IndexInfo", "IndexState", "Topology"]


class IndexState(StrEnum):
    """The index lifecycle: writers maintain ``building`` and ``ready`` indexes, queries
    use ``ready`` ones; the value is what the catalog stores."""

    BUILDING = "building"
    READY = "ready"
    DROPPED = "dropped"


@dataclass(frozen=True)
class IndexInfo:
    """An index definition with its lifecycle state."""

    index: Index
    state: IndexState
    created: int
    changed: int


@dataclass(frozen=True)
class Topology:
    """A snapshot of the catalog: where every logical shard lives, and the indexes."""

    prefix: str
    n_shards: int
    map_version: int
    refresh_interval: float
    servers: dict[int, Address]
    shard_servers: tuple[int, ...]
    indexes: dict[str, IndexInfo]
    dictionary_ids: tuple[int, ...]
    active_dictionary: int | None
    moves: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # shard -> move
    replicas: dict[int, tuple[Address, ...]] = field(default_factory=dict)  # server -> replicas
    index_epoch: int = 0  # bumped by every index declaration; 0: a catalog from before fences
    expire_on: str | None = None  # the property holding expiry times (schemaless.expiry)
    changes: bool = False  # the change feed is on (schemaless.feed)
    layout: str = DATABASES  # OWNED: one database per server, the shard a column

    @property
    def owned_db(self) -> str | None:
        """The data database of the owned layout (the same on every server); None in
        the layout of a database per logical shard.  Batches that name it end with
        ``owned.check_sql``."""
        return data_db(self.prefix) if self.layout == OWNED else None

    @property
    def fence(self) -> str | None:
        """The fence table every write of a body names (None before fences existed)."""
        return fence_table(self.index_epoch) if self.index_epoch else None

    @property
    def routing(self) -> tuple[int, int, tuple[str, ...]]:
        """What decides which tables a client names (the map, the fence, the indexes
        writers maintain): when it changed, a client that got "table doesn't exist"
        retries on the new map."""
        return self.map_version, self.index_epoch, tuple(sorted(i.name for i in self.maintained()))

    @cached_property
    def dbs(self) -> tuple[str, ...]:
        """The database of every logical shard, by shard number (in the owned layout,
        the server's data database for each)."""
        if self.layout == OWNED:
            return (data_db(self.prefix),) * self.n_shards
        return tuple(shard_db(self.prefix, s) for s in range(self.n_shards))

    def move_hints(self) -> list[str]:
        """Each unfinished move recorded in the map, and the commands that end it (a
        mover that died leaves its shard waiting until one runs)."""
        return [
            f"shard {shard}: move {self.servers[source]} -> {self.servers[target]} unfinished"
            f" ({phase}): if no move is running, `schemaless shards move {shard} --to"
            f" {target}` finishes it, `schemaless shards rollback {shard}` undoes it"
            for shard, (source, target, phase) in sorted(self.moves.items())
        ]

    def addresses_of(self, shards: Iterable[int]) -> list[str]:
        """The addresses of the servers that hold ``shards``, sorted."""
        return sorted({str(self.servers[self.shard_servers[s]]) for s in shards})

    def shards_of(self, server_id: int) -> list[int]:
        """The logical shards that live on one server."""
        return list(self.placed.get(server_id, ()))

    @cached_property
    def placed(self) -> dict[int, tuple[int, ...]]:
        """Each server's logical shards, ascending (servers without any left out)."""
        out: dict[int, list[int]] = {}
        for s, sid in enumerate(self.shard_servers):
            out.setdefault(sid, []).append(s)
        return {sid: Shards(shards) for sid, shards in out.items()}

    @cached_property
    def counted(self) -> tuple[Index, ...]:
        """The counted indexes writers maintain (``schemaless.counts``): step 2 keeps
        their counters."""
        return tuple(index for index in self.maintained() if index.counted)

    def maintained(self) -> list[Index]:
        """Indexes that writers keep up to date (building or ready)."""
        return [i.index for i in self.indexes.values() if i.state != IndexState.DROPPED]

    def ready(self) -> list[Index]:
        """Indexes that are ``ready`` (backfilled; their tables have ``KEY by_entity``)."""
        return [i.index for i in self.indexes.values() if i.state == IndexState.READY]
