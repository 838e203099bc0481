"""Routing: the servers of a datastore and its shard map.

A ``Cluster`` opens (or initialises) the catalog, keeps a refreshed ``Topology`` and
one connection pool per server (``connection.gather`` runs batches on several).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Container, Mapping, Sequence
from typing import TypeVar

from . import counts, forking, owned
from .catalog import Catalog, Topology
from .codec import Codec
from .connection import ConnectOptions, Server, Tracer
from .dsn import Address
from .errors import (
    CatalogError,
    CatalogUnavailable,
    InvalidQuery,
    PermissionDenied,
    SchemalessError,
    ShardUnavailable,
)
from .hashing import shard_of
from .index import Index
from .latency import LatencyReporter
from .locate import DEFAULT_PREFIX
from .names import quote
from .owned import OWNED, admin, placement
from .scatter import (
    Scattered,
    Statement,
    bare,
    dbs_by_server,
    rounds,
    scatter,
    unreachable_only,
)
from .schema import entities_table_sql, fence_epoch, fence_table, fence_table_sql
from .tables import by_id_sql

__all__ = ["DEFAULT_SHARDS", "SAFE_PACKET", "Cluster", "unreachable_only"]

log = logging.getLogger(__name__)

G = TypeVar("G")

#: Logical shards created when a datastore is initialised without saying how many.
DEFAULT_SHARDS = 64
#: The max_allowed_packet a batch assumes of a server not connected to yet (MySQL's
#: default since 5.6; MariaDB's is 16 MiB): its own is read on its first connection.
SAFE_PACKET = 4 * 1024 * 1024
_PACKET_MARGIN = 64 * 1024


class Cluster:
    """The servers of one datastore and where each logical shard lives."""

    def __init__(
        self,
        addresses: Sequence[Address],
        options: ConnectOptions,
        *,
        prefix: str = "schemaless",
        create: bool = True,
        n_shards: int | None = None,
        refresh_interval: float = 5.0,
        tracer: Tracer | None = None,
        codec: Codec | None = None,
        max_replica_lag: float = 5.0,
        layout: str = OWNED,
    ) -> None:
        if not addresses:
            raise CatalogError("no servers given: pass mysql_shards=['host:port', ...]")
        self.options = options
        self.tracer = tracer
        self.on_retry: Callable[[str, SchemalessError], None] | None = None  # schemaless.hooks
        self.codec = codec or Codec()
        self.max_replica_lag = max_replica_lag
        self._lags: dict[Address, tuple[float, float | None]] = {}
        self._servers: dict[Address, Server] = {}
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._retry_at = 0.0  # after a failed reload: not before then
        forking.register(self)
        self._all_servers: tuple[Topology, Mapping[int, Server]] | None = None
        self._guarded_db: str | None = None  # the owned layout's (see ``_guard``)
        self.catalog = Catalog(self.server(addresses[0]), prefix)
        self.latency = LatencyReporter(self.catalog)  # the Cleaner switches it off
        if not self._catalog_exists():
            if not create:
                named = "" if prefix == DEFAULT_PREFIX else f" --prefix {prefix}"
                raise CatalogError(
                    f"no datastore {prefix!r} on {addresses[0]}: run `schemaless{named} init` first"
                )
            self._initialise(list(addresses), n_shards or DEFAULT_SHARDS, refresh_interval, layout)
        elif create:
            with contextlib.suppress(PermissionDenied):  # an application user without DDL
                self.catalog.ensure_tables()
        self._loaded = time.monotonic()
        self.topology = self.catalog.load()
        self._guard(self.topology)
        if create and not self.topology.index_epoch:  # a catalog from before fences
            with contextlib.suppress(PermissionDenied):
                self.create_fences(self.topology, 1)
                self.catalog.start_epochs()
                self.refresh()
        if n_shards is not None and n_shards != self.topology.n_shards:
            raise CatalogError(
                f"datastore {prefix!r} has {self.topology.n_shards} logical shards; "
                f"refusing to change it to {n_shards}"
            )
        self._check_servers(addresses)
        self._sync_codec(self.topology)

    def _check_servers(self, addresses: Sequence[Address]) -> None:
        """Refuse servers given that are not the datastore's."""
        known = set(self.topology.servers.values())
        # The first address is where the catalog was found, however it was spelt.
        unknown = [str(a) for a in addresses[1:] if a not in known]
        if unknown:
            raise CatalogError(
                f"servers {', '.join(unknown)} are not part of datastore "
                f"{self.topology.prefix!r} (its servers: "
                f"{', '.join(sorted(str(a) for a in known))})"
            )

    def _guard(self, topo: Topology) -> None:
        """In the owned layout, every server refuses a batch that names the data
        database without the ownership check (``Server.send``)."""
        if topo.owned_db is not None:
            with self._lock:
                self._guarded_db = quote(topo.owned_db)
                for server in self._servers.values():
                    server.guarded_db = self._guarded_db

    def _catalog_exists(self) -> bool:
        """Whether the catalog is there; ``CatalogUnavailable`` if its server is not."""
        try:
            return self.catalog.exists()
        except ShardUnavailable as exc:
            raise CatalogUnavailable(
                f"cannot open datastore {self.catalog.prefix!r}: its catalog's server "
                f"{self.catalog.server.name} is unreachable ({exc}); start that server "
                "(no other server can stand in for it), then open again"
            ) from exc

    # -- servers and topology ------------------------------------------------------------

    def server(self, address: Address) -> Server:
        """The connection pool of one server (created on first use)."""
        with self._lock:
            server = self._servers.get(address)
            if server is None:
                server = Server(address, self.options, self.tracer, self._learnt_packet)
                server.on_retry = self.on_retry
                server.guarded_db = self._guarded_db
                self._servers[address] = server
            return server

    def servers(self) -> list[Server]:
        """Every connection pool opened so far (replicas included)."""
        with self._lock:
            return list(self._servers.values())

    def after_fork(self) -> None:
        """In a forked child: fresh locks (a parent thread may have held one)."""
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()

    def current(self) -> Topology:
        """The topology, reloaded from the catalog when older than its refresh interval.

        While the catalog's server is unreachable, the map in hand stays in use (and
        the catalog is tried again an interval later): a stale map is safe, since a
        move or a declaration fences the tables it would get wrong.
        """
        topo = self.topology
        now = time.monotonic()
        if (
            now - self._loaded >= topo.refresh_interval
            and now >= self._retry_at
            and self._refreshing.acquire(blocking=False)
        ):  # one thread reloads; the others keep using the map they have
            try:
                self.refresh()
                with self._lock:
                    servers = list(self._servers.values())
                self.latency.maybe_publish(servers)
            except ShardUnavailable as exc:
                self._retry_at = time.monotonic() + topo.refresh_interval
                log.warning(
                    "catalog unreachable, carrying on with the map loaded %.0fs ago: %s",
                    now - self._loaded,
                    exc,
                )
            finally:
                self._refreshing.release()
        return self.topology

    def refresh(self) -> Topology:
        """Reload the catalog now; return the newest map known to this client.

        Loads that overlap may finish out of order: one that started before the map in
        use was loaded is dropped, so the map never goes back to an older version.
        """
        started = time.monotonic()
        topo = self.catalog.load()
        self._sync_codec(topo)
        with self._lock:
            if started >= self._loaded:  # the map is at least as new as the load's start
                self.topology, self._loaded = topo, started
            return self.topology

    def reader(self, topo: Topology, server_id: int, consistency: str) -> Server:
        """Where to read a server's shards: the server itself, or with
        ``consistency="replica"`` one of its replicas lagging at most
        ``max_replica_lag`` seconds (the primary when none qualifies)."""
        primary = self.all_servers(topo)[server_id]
        if consistency == "primary":
            return primary
        if consistency != "replica":
            raise InvalidQuery(f"consistency must be 'primary' or 'replica', got {consistency!r}")
        for address in topo.replicas.get(server_id, ()):
            lag = self._lag(address)
            if lag is not None and lag <= self.max_replica_lag:
                return self.server(address)
        return primary

    def _lag(self, address: Address) -> float | None:
        """A replica's lag, checked at most once a second."""
        now = time.monotonic()
        checked = self._lags.get(address)
        if checked is not None and now - checked[0] < 1.0:
            return checked[1]
        try:
            lag = self.server(address).replica_lag()
        except (ShardUnavailable, PermissionDenied):
            lag = None  # unusable for reads now: the primary serves them
        self._lags[address] = (now, lag)
        return lag

    def shard_of_id(self, entity_id: bytes) -> int:
        """The logical shard that stores an entity."""
        return shard_of(entity_id, self.topology.n_shards)

    def scatter(
        self,
        topo: Topology,
        groups: Mapping[int, G],
        build: Callable[[G], Statement],
        *,
        consistency: str | None = None,
        partial: bool = False,
        commits: bool = False,
        idempotent: bool = True,
    ) -> Scattered:
        """``scatter.scatter`` on the servers of ``topo`` (``groups`` by server id); reads
        that name a ``consistency`` go where ``reader`` says."""
        if consistency is None or consistency == "primary":
            server: Callable[[int], Server] = self.all_servers(topo).__getitem__
        else:
            server = functools.partial(self.reader, topo, consistency=consistency)
        return scatter(
            server, groups, build, partial=partial, commits=commits, idempotent=idempotent
        )

    def by_id(
        self,
        topo: Topology,
        groups: Mapping[int, Mapping[int, Sequence[bytes]]],
        columns: str,
        *,
        consistency: str | None = None,
        partial: bool = False,
    ) -> Scattered:
        """Entity rows by id (tombstones included), per server id ``{shard: ids}``: one
        ``tables.by_id_sql`` per server (``columns`` begin with the id), its rows the
        first result set.  In the owned layout a server whose ``owned`` rows are not
        the map's (a move between its fence and its flip, or a stale map) is read
        again with the check that counts the shards named."""
        found = self.scatter(
            topo,
            groups,
            lambda ids: by_id_sql(topo, ids, columns),
            consistency=consistency,
            partial=partial,
        )
        if topo.owned_db is None:
            return found
        again = {sid: groups[sid] for sid, sets in found.results.items() if not sets[0]}
        results = {
            sid: [tuple(r for r in sets[0] if r[0] is not None)]  # not the LEFT JOIN's NULLs
            for sid, sets in found.results.items()
            if sid not in again
        }
        errors = dict(found.errors)
        if again:
            counted = self.scatter(
                topo,
                again,
                lambda ids: by_id_sql(topo, ids, columns, counted=True),
                consistency=consistency,
                partial=partial,
            )
            results.update(counted.results)
            errors.update(counted.errors)
        return Scattered(results, errors, {})

    def server_of_shard(self, topo: Topology, shard: int) -> Server:
        """The server a logical shard lives on."""
        return self.all_servers(topo)[topo.shard_servers[shard]]

    def all_servers(self, topo: Topology) -> Mapping[int, Server]:
        """Every server of the topology, by server id (kept for the latest topology)."""
        cached = self._all_servers
        if cached is not None and cached[0] is topo:
            return cached[1]
        servers = {sid: self.server(addr) for sid, addr in topo.servers.items()}
        self._all_servers = (topo, servers)
        return servers

    # -- schema --------------------------------------------------------------------------

    def create_shards(self, topo: Topology) -> None:
        """Create the shard databases, their entities tables and fences (owned layout:
        each server's data database, its ``owned`` rows and its fence)."""
        db = topo.owned_db
        if db is None:
            self.on_dbs(
                topo,
                lambda db: [
                    f"CREATE DATABASE IF NOT EXISTS {quote(db)}",
                    entities_table_sql(db),
                    fence_table_sql(db, topo.index_epoch),
                ],
            )
            return

        def build(sid: int) -> Statement:
            stmts = [*owned.entities_table_sql(db), fence_table_sql(db, topo.index_epoch)]
            if topo.changes:
                stmts += owned.changes_tables_sql(db)
            stmts += owned.owned_rows_sql(db, topo.shards_of(sid), changes=topo.changes)
            return admin(stmts), ()

        self.scatter(topo, {sid: sid for sid in topo.servers}, build)

    def create_fences(self, topo: Topology, epoch: int) -> None:
        """Create the fence table of an index epoch on every logical shard."""
        self.on_dbs(topo, lambda db: [fence_table_sql(db, epoch)])

    def fences(
        self, topo: Topology, servers: Container[int] | None = None
    ) -> dict[int, list[tuple[str, int]]]:
        """The fence tables on each server's databases: ``(database, epoch)``
        (``servers``: only on those server ids)."""

        def build(dbs: list[str]) -> Statement:
            marks = ", ".join(["%s"] * len(dbs))
            sql = (
                "SELECT table_schema, table_name FROM information_schema.tables"
                f" WHERE table_schema IN ({marks}) AND table_name LIKE 'fence\\_%%'"
            )
            return sql, dbs

        groups = dbs_by_server(topo)
        if servers is not None:
            groups = {sid: group for sid, group in groups.items() if sid in servers}
        out: dict[int, list[tuple[str, int]]] = {}
        for sid, sets in self.scatter(topo, groups, build).results.items():
            for db, table in sets[0]:
                epoch = fence_epoch(str(table))
                if epoch is not None:
                    out.setdefault(sid, []).append((str(db), epoch))
        return out

    def old_fences(
        self, topo: Topology, servers: Container[int] | None = None
    ) -> dict[int, list[tuple[str, int]]]:
        """The fences of index epochs before ``topo``'s, per server (none once every
        declaration has finished; ``servers``: only on those server ids)."""
        found = self.fences(topo, servers).items()
        old = {sid: [(db, e) for db, e in dbs if e < topo.index_epoch] for sid, dbs in found}
        return {sid: dbs for sid, dbs in old.items() if dbs}

    def retire_fences(self, topo: Topology) -> None:
        """Drop the fences of index epochs before ``topo``'s: each drop waits for the
        writes in flight that named it; later writes with an older map fail
        (``TableMissing``), refresh and write again with the new indexes."""

        def build(old: list[tuple[str, int]]) -> Statement:
            tables = ", ".join(quote(db, fence_table(e)) for db, e in old)
            return admin(
                ["SET SESSION lock_wait_timeout = 60", f"DROP TABLE IF EXISTS {tables}"]
            ), ()

        self.scatter(topo, self.old_fences(topo), build)

    def create_index_tables(
        self, topo: Topology, index: Index, *, fresh: bool = False, entity_key: bool = True
    ) -> None:
        """Create an index's table on every logical shard (``fresh``: dropping any table
        of that name first; ``entity_key`` False: without ``KEY by_entity``, which
        ``add_entity_keys`` builds when the backfill ends).  Never a shard's database or
        entities table: a shard fenced by a move has none, and must not get new ones."""
        shard = topo.owned_db is not None

        def sql(db: str) -> list[str]:
            first = [f"DROP TABLE IF EXISTS {quote(db, index.table)}"] if fresh else []
            if not shard:
                return [*first, index.create_table_sql(db, entity_key=entity_key)]
            counted = counts.tables_sql(db) if index.counted else []
            return [*first, *owned.index_table_sql(db, index, entity_key=entity_key), *counted]

        self.on_dbs(topo, sql)

    def add_entity_keys(
        self, topo: Topology, index: Index, rest: Callable[[float], None] | None = None
    ) -> None:
        """Build ``KEY by_entity`` on the index's table of every logical shard that has
        none, servers in parallel, one table per call (each call's read timeout bounds
        one table's build); a metadata lock waited for more than 5 s is an error to
        retry (docs/architecture.md, "The ``by_entity`` key is built last").  With
        ``rest``: one table at a time in the whole cluster, ``rest(seconds it took)``
        after each (a throttled backfill's gentle build)."""

        head = "SET STATEMENT lock_wait_timeout = 5 FOR "  # not the pooled session's
        servers = self.all_servers(topo).__getitem__
        batches = {
            sid: [bare(admin([head + index.entity_key_sql(db)])) for db in dbs]
            for sid, dbs in dbs_by_server(topo).items()
        }
        if rest is None:
            rounds(servers, batches)
            return
        for sid, statements in batches.items():
            for statement in statements:
                started = time.monotonic()
                rounds(servers, {sid: [statement]})
                rest(time.monotonic() - started)

    def on_dbs(self, topo: Topology, sql: Callable[[str], list[str]]) -> None:
        """Run the statements ``sql(db)`` of every shard database (owned layout: of
        every server's data database), servers in parallel."""

        def build(dbs: list[str]) -> Statement:
            return admin([stmt for db in dbs for stmt in sql(db)]), ()

        self.scatter(topo, dbs_by_server(topo), build)

    def drop_tables(self, topo: Topology, index: Index) -> None:
        """Remove an index's table from every logical shard."""
        self.on_dbs(topo, lambda db: [f"DROP TABLE IF EXISTS {quote(db, index.table)}"])

    def _initialise(
        self, addresses: list[Address], n_shards: int, refresh: float, layout: str
    ) -> None:
        """Create the shards first, then the catalog that makes them visible."""
        shard_servers = tuple(placement(n_shards, len(addresses), layout))
        draft = Topology(
            prefix=self.catalog.prefix,
            n_shards=n_shards,
            map_version=0,
            refresh_interval=refresh,
            servers=dict(enumerate(addresses)),
            shard_servers=shard_servers,
            indexes={},
            dictionary_ids=(),
            active_dictionary=None,
            index_epoch=1,
            layout=layout,
        )
        self.create_shards(draft)
        if self.catalog.create(addresses, n_shards, refresh, layout):
            log.info(
                "initialised datastore %r: %d logical shards on %d servers",
                self.catalog.prefix,
                n_shards,
                len(addresses),
            )

    def _sync_codec(self, topo: Topology) -> None:
        for dict_id in topo.dictionary_ids:
            if not self.codec.has_dictionary(dict_id):
                self.codec.add_dictionary(dict_id, self.catalog.dictionary(dict_id))
        self.codec.use_dictionary(topo.active_dictionary)

    @property
    def max_batch_bytes(self) -> int:
        """The largest statement batch to send: below every server's max_allowed_packet,
        where a server not connected to yet counts as ``SAFE_PACKET``."""
        servers = self.all_servers(self.topology).values()
        return min(s.max_packet or SAFE_PACKET for s in servers) - _PACKET_MARGIN

    def _learnt_packet(self, packet: int) -> None:
        """A server's max_allowed_packet, read on its first connection: bodies stay
        below that of every server connected to (the catalog's from the open on)."""
        with self._lock:
            self.codec.max_body_bytes = min(self.codec.max_body_bytes, packet - _PACKET_MARGIN)

    def close(self) -> None:
        """Close every pool."""
        for server in self.servers():
            server.close()
