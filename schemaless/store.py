"""The datastore: put, get, delete, update and their batch forms, index lifecycle and
queries.  Writes run the protocol of ``schemaless.protocol``."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from . import failpoints
from .catalog import IndexInfo, Topology
from .clock import VersionClock
from .cluster import Cluster, unreachable_only
from .codec import Codec, train_dictionary
from .connection import Batch, ConnectOptions, Retry, Tracer, gather, gather_partial
from .deadline import current as current_deadline
from .deadline import within
from .dsn import Address, Credentials, parse_address
from .entity import Entity
from .errors import (
    CatalogError,
    ConflictError,
    CorruptEntity,
    IndexDefinitionError,
    IndexNotReady,
    InvalidEntity,
    InvalidQuery,
    PermissionDenied,
    TableMissing,
    UniqueViolation,
)
from .feed import ChangeEvent, ChangeFeed, decode_cursor, enable_changes, part_shards
from .health import HealthState
from .ids import id_hex, to_id
from .index import Index
from .names import quote
from .protocol import Writer
from .query import Page, QueryEngine
from .schema import shard_db
from .subscriptions import Subscription
from .writes import (
    BLIND,
    CREATE,
    by_id_sql,
)

__all__ = ["DataStore"]

log = logging.getLogger(__name__)
_ID_BYTES = 40  # at most the SQL of one id in a fetch's IN (...) list, escaped

T = TypeVar("T")

_DECLARE_ATTEMPTS = 5  # declarations racing each other for the next index epoch


class DataStore:
    """Schemaless entities on sharded MySQL/MariaDB servers.

    ``DataStore(mysql_shards=["127.0.0.1:3306", "127.0.0.1:3307"], indexes=[...])``
    opens the datastore whose catalog is on the first server, initialising one with
    ``shards`` logical shards (default 64) if there is none yet.  ``timeout``: every
    call returns or raises within this many seconds (default ``read_timeout``).
    """

    def __init__(
        self,
        mysql_shards: Sequence[str] = (),
        indexes: Sequence[Index] = (),
        *,
        user: str | None = None,
        password: str | None = None,
        option_file: str | None = None,
        prefix: str = "schemaless",
        shards: int | None = None,
        create: bool = True,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        write_timeout: float = 30.0,
        pool_size: int = 16,
        refresh_interval: float = 5.0,
        retry: Retry | None = None,
        ssl: dict[str, str] | None = None,
        max_body_bytes: int = 4 * 1024 * 1024,
        tracer: Tracer | None = None,
        move_wait: float = 30.0,
        max_replica_lag: float = 5.0,
        timeout: float | None = None,
        claim_wait: float = 0.2,
        changes: bool = False,
    ) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        #: Every call returns or raises within this many seconds (plus a small margin):
        #: by default read_timeout.  Most calls take their own ``timeout=`` too.
        self.timeout: float = read_timeout if timeout is None else timeout
        if isinstance(mysql_shards, str):
            mysql_shards = [mysql_shards]
        parsed = [parse_address(spec) for spec in mysql_shards]
        creds = Credentials.resolve(user, password, option_file)
        if parsed:
            creds = parsed[0][1].merged(creds)
        options = ConnectOptions(
            credentials=creds,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            pool_size=pool_size,
            ssl=ssl,
            retry=retry or Retry(),
        )
        addresses: list[Address] = [address for address, _ in parsed]
        self.cluster = Cluster(
            addresses,
            options,
            prefix=prefix,
            create=create,
            n_shards=shards,
            refresh_interval=refresh_interval,
            tracer=tracer,
            codec=Codec(max_body_bytes=max_body_bytes),
            max_replica_lag=max_replica_lag,
        )
        self.codec = self.cluster.codec
        self.clock = VersionClock()
        self.move_wait = move_wait
        self._writer = Writer(self.cluster, self.codec, self.clock, self.decode)
        self.claims = self._writer.claims  # internal: the Cleaner's backfill claims too
        self.claims.wait = claim_wait
        self._query = QueryEngine(self)
        if changes:
            enable_changes(self)
        for index in indexes:
            self.declare_index(index)

    def __repr__(self) -> str:
        topo = self.cluster.topology
        return (
            f"DataStore(prefix={topo.prefix!r}, shards={topo.n_shards}, "
            f"servers={[str(a) for a in topo.servers.values()]})"
        )

    def __enter__(self) -> DataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Delete the stale index rows still queued, then close every connection."""
        self._writer.stale.close()
        self.cluster.close()

    def health(self) -> dict[str, HealthState]:
        """What this client believes about each server it has used: healthy, suspect,
        or down since a time (calls that need it fail at once), with the error that
        marked it and how many times it was marked down (``schemaless.health``)."""
        return {server.name: server.health.state for server in self.cluster.servers()}

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the index rows that earlier writes made stale are deleted.

        Writes return once the entity has committed; the rows its old body produced
        are deleted in the background (queries never return them meanwhile: every
        index row is re-checked against the stored entity).  False if ``timeout``
        seconds passed first."""
        return self._writer.stale.flush(timeout)

    # -- reads ---------------------------------------------------------------------------

    def get(
        self,
        entity_id: bytes | Any,
        *,
        consistency: str = "primary",
        timeout: float | None = None,
    ) -> Entity | None:
        """The entity with this id, or None.

        ``consistency="replica"`` may read from a replica lagging at most
        ``max_replica_lag`` seconds (so it may miss this client's latest writes).
        ``timeout``: this call's deadline in seconds (default: the datastore's).
        """
        key = to_id(entity_id)
        return self.call(lambda: self._get_one(key, consistency), timeout)

    def _get_one(self, key: bytes, consistency: str) -> Entity | None:
        topo = self.cluster.current()
        shard = self.cluster.shard_of_id(key)
        server = self.cluster.reader(topo, topo.shard_servers[shard], consistency)
        rows = server.run(_get_sql(topo.dbs[shard]), (key,))[0]
        if not rows or rows[0][1] is None:  # absent, or a tombstone
            return None
        return self.decode(key, shard, rows[0][0], rows[0][1])

    def get_many(
        self,
        ids: Iterable[bytes | Any],
        *,
        consistency: str = "primary",
        timeout: float | None = None,
    ) -> list[Entity | None]:
        """The entities with these ids, in order (None where absent).

        One statement per server, servers in parallel (more when the ids would not fit
        in the servers' max_allowed_packet).
        """
        keys = [to_id(i) for i in ids]
        unique = list(set(keys))
        step = self.cluster.max_batch_bytes // _ID_BYTES  # ids one statement can carry
        found: dict[bytes, Entity] = {}
        with self.deadline(timeout):
            for start in range(0, len(unique), step):
                part = set(unique[start : start + step])
                found.update(self.rerouted(functools.partial(self.fetch, part, consistency))[0])
        return [found.get(k) for k in keys]

    def fetch(
        self, ids: set[bytes], consistency: str = "primary", *, partial: bool = False
    ) -> tuple[dict[bytes, Entity], set[int]]:
        """Internal: live entities by id, one statement per server; with ``partial``,
        the logical shards whose server did not answer instead of an error."""
        if not ids:
            return {}, set()
        topo = self.cluster.current()
        by_server = self.cluster.ids_by_server(topo, ids)
        batches = {
            sid: Batch(
                self.cluster.reader(topo, sid, consistency),
                *by_id_sql(topo.prefix, shards, "`id`, `version`, `body`"),
            )
            for sid, shards in by_server.items()
        }
        missing: set[int] = set()
        if partial:
            results, errors = gather_partial(batches)
            unreachable_only(errors)
            missing = {shard for sid in errors for shard in by_server[sid]}
        else:
            results = gather(batches)
        out: dict[bytes, Entity] = {}
        for sets in results.values():
            for key, version, body in sets[0]:
                if body is not None:  # a tombstone otherwise
                    out[key] = self.decode(key, None, version, body)
        return out, missing

    def decode(self, entity_id: bytes, shard: int | None, version: int, body: bytes) -> Entity:
        """Internal: decode a stored body, naming the entity and its shard (found from
        the id when None) on failure."""
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

    # -- writes --------------------------------------------------------------------------

    def put(
        self,
        entity: Mapping[str, Any],
        *,
        expect_version: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Store an entity; return its new version.

        An entity without an ``id`` gets a new one (written into the dict).
        ``expect_version``: the version read earlier (0: the entity must not exist);
        if the stored version differs, raise ``ConflictError`` and write nothing
        that a reader could see.  ``timeout``: as in ``get``.
        """
        if expect_version is not None and (
            not isinstance(expect_version, int) or expect_version < 0
        ):
            raise InvalidEntity(f"expect_version must be an int >= 0, got {expect_version!r}")
        mode: str | int = BLIND if expect_version is None else expect_version or CREATE
        return self.call(lambda: self._writer.write([entity], mode), timeout)[0]

    def put_many(
        self, entities: Iterable[Mapping[str, Any]], *, timeout: float | None = None
    ) -> list[int]:
        """Store many entities (last writer wins); return their new versions in order.

        Each step is one statement batch per server, servers in parallel; a batch that
        would not fit in the servers' max_allowed_packet is written in parts, in turn.
        """
        batch = list(entities)
        return self.call(lambda: self._writer.write(batch, BLIND), timeout)

    def delete(
        self,
        entity_id: bytes | Any,
        *,
        expect_version: int | None = None,
        timeout: float | None = None,
    ) -> bool:
        """Delete an entity; True if it existed.  See ``put`` for ``expect_version``
        and ``timeout``."""
        if expect_version is not None and (
            not isinstance(expect_version, int) or expect_version < 1
        ):
            raise InvalidEntity(f"expect_version must be an int >= 1, got {expect_version!r}")
        mode: str | int = BLIND if expect_version is None else expect_version
        key = to_id(entity_id)
        return self.call(lambda: self._writer.delete([key], mode), timeout) == 1

    def delete_many(self, ids: Iterable[bytes | Any], *, timeout: float | None = None) -> int:
        """Delete many entities; return how many existed."""
        keys = list(dict.fromkeys(to_id(i) for i in ids))
        return self.call(lambda: self._writer.delete(keys, BLIND), timeout) if keys else 0

    def update(
        self,
        entity_id: bytes | Any,
        fn: Callable[[Entity | None], Mapping[str, Any]],
        *,
        retries: int = 10,
        timeout: float | None = None,
    ) -> Entity:
        """Read-modify-write: store ``fn(current)``; on a conflict call ``fn`` again.

        ``fn`` gets the current entity (a copy, or None if absent) and returns the new
        one.  After ``retries`` conflicts, ``ConflictError`` is raised; a
        ``UniqueViolation`` is raised at once.  ``timeout``: the deadline of the whole
        call, every attempt included.
        """
        with self.deadline(timeout):
            return self._update(to_id(entity_id), fn, retries)

    def _update(
        self, key: bytes, fn: Callable[[Entity | None], Mapping[str, Any]], retries: int
    ) -> Entity:
        for _ in range(max(1, retries)):
            current = self.get(key)
            version = current.version if current is not None else 0
            new = dict(fn(Entity(current, version) if current is not None else None))
            failpoints.hit("update.before_put")
            if to_id(new.setdefault("id", key)) != key:
                raise InvalidEntity("update() must not change the entity's id")
            try:
                stored = self.put(new, expect_version=version)
            except UniqueViolation:
                raise  # calling fn again would claim the same value
            except ConflictError:
                continue
            return Entity(new, stored)
        raise ConflictError(f"entity {id_hex(key)}: still conflicting after {retries} attempts")

    def deadline(self, timeout: float | None = None) -> contextlib.AbstractContextManager[None]:
        """Internal: the deadline of one call (``timeout`` seconds, default the
        datastore's), which every server call in it keeps (``schemaless.deadline``)."""
        return within(self.timeout if timeout is None else timeout)

    def call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Internal: ``rerouted(fn)`` within one call's deadline."""
        with self.deadline(timeout):
            return self.rerouted(fn)

    def rerouted(self, fn: Callable[[], T]) -> T:
        """Internal: run ``fn``; when its tables are gone because the map changed (a
        logical shard moved, an index was declared and the old fence dropped, or an
        index was dropped and purged), refresh the map and run it again; while a move is
        under way, wait for it (up to ``move_wait``, and never past the call's
        deadline): writers pause, they do not fail."""
        until = time.monotonic() + self.move_wait
        at = current_deadline()
        if at is not None:
            until = min(until, at)
        delay = 0.01
        while True:
            seen = self.cluster.topology
            try:
                return fn()
            except TableMissing:
                topo = self.cluster.refresh()
                if topo.routing != seen.routing:
                    continue
                if not topo.moves or time.monotonic() + delay >= until:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.25)

    def train_dictionary(self, samples: int = 5000, size: int = 16384) -> int:
        """Train a zstd dictionary on stored entities, store it in the catalog and use it
        for new bodies (old bodies name their own dictionary); return its id."""
        topo = self.cluster.refresh()
        per_shard = max(1, samples // topo.n_shards)
        calls = {}
        for sid, server in self.cluster.all_servers(topo).items():
            parts = [
                f"(SELECT `id`, `version`, `body`, {int(s)} FROM "
                f"{quote(topo.dbs[s], 'entities')} WHERE `body` IS NOT NULL "
                f"ORDER BY `added_id` DESC LIMIT {int(per_shard)})"
                for s in topo.shards_of(sid)
            ]
            if parts:
                calls[sid] = Batch(server, " UNION ALL ".join(parts))
        entities = [
            self.decode(bytes(r[0]), int(r[3]), int(r[1]), bytes(r[2]))
            for rows in gather(calls).values()
            for r in rows[0]
        ]
        if len(entities) < 100:
            raise InvalidEntity(
                f"need at least 100 stored entities to train a dictionary, found {len(entities)}"
            )
        dict_id = self.cluster.catalog.add_dictionary(train_dictionary(entities, size))
        self.cluster.refresh()
        return dict_id

    # -- indexes and queries -------------------------------------------------------------

    # -- the change feed (schemaless.feed) -----------------------------------------------

    def changes(
        self,
        cursor: str | None = None,
        follow: bool = False,
        *,
        snapshot: bool = False,
        part: tuple[int, int] | None = None,
    ) -> Iterator[ChangeEvent]:
        """The change feed (``DataStore(changes=True)``): events in each logical shard's
        commit order, per entity in increasing version order, deletes included
        (``event.entity`` None), at least once; each ``event.cursor`` resumes after it.
        ``cursor`` None: from the oldest change kept, or, with ``snapshot``, every live
        entity first and then the changes since.  Without ``follow`` it ends once it has
        caught up.  ``part=(k, n)``: the logical shards with ``shard % n == k``."""
        n_shards = self.cluster.current().n_shards
        shards = part_shards(n_shards, part)
        if cursor is not None:
            positions = dict(decode_cursor(cursor, n_shards))
        else:
            positions = {s: (None, 0) for s in shards} if snapshot else {}
        return ChangeFeed(self, positions, shards).events(follow)

    def subscribe(
        self, name: str, *, part: tuple[int, int] | None = None, snapshot: bool = False
    ) -> Subscription:
        """A named consumer whose positions live in the catalog: ``sub.changes()``
        resumes after what ``sub.ack(event)`` acknowledged, also after a restart; a new
        one starts from the oldest change kept, or with a snapshot."""
        return Subscription(self, name, part, snapshot)

    def declare_index(self, index: Index) -> str:
        """Create an index's tables and record it; return its state.

        On a datastore with no entities the index is ``ready`` at once; otherwise it is
        ``building`` until ``cleaner --index=NAME`` has backfilled it.  Declaring the
        same definition again is a no-op (for a ``building`` index it also finishes an
        interrupted declaration); a different one under the name is an error.

        The declaration moves the index epoch on: the next epoch's fence tables first,
        then the index with the new epoch in the catalog, then the old fences dropped.
        Each drop waits for the writes in flight that named it; a later write from a
        map without the index fails, refreshes and writes again with it (``rerouted``).
        """
        if not isinstance(index, Index):
            raise IndexDefinitionError(f"expected an Index, got {type(index).__name__}")
        state = self._declared(index, self.cluster.refresh())  # no lock for a known one
        if state is not None:
            return state
        busy = "another client is declaring an index of this datastore"
        with self.cluster.catalog.lock("declare", busy, wait=20):
            return self._declare(index)

    def _declared(self, index: Index, topo: Topology) -> str | None:
        """The state of ``index`` if the catalog has it (finishing a declaration that
        died); None if it has no index of that name; an error if another definition."""
        existing = topo.indexes.get(index.name)
        if existing is None:
            return None
        if existing.index != index:
            raise IndexDefinitionError(
                f"index {index.name!r} already exists with a different definition: "
                f"{existing.index!r}; drop and purge it first"
            )
        if existing.state == "dropped":
            raise IndexDefinitionError(
                f"index {index.name!r} was dropped; purge it before declaring it again"
            )
        if existing.state == "building":  # finish a declaration that died
            with contextlib.suppress(PermissionDenied):  # an admin's to finish
                self.cluster.retire_fences(topo)
        return existing.state

    def _declare(self, index: Index) -> str:
        """``declare_index`` under the declaration lock."""
        for _ in range(_DECLARE_ATTEMPTS):
            topo = self.cluster.refresh()
            state = self._declared(index, topo)
            if state is not None:
                return state
            if topo.moves:  # its tables would miss the moving shards' new servers
                raise CatalogError(
                    f"logical shards {', '.join(map(str, sorted(topo.moves)))} are being moved:"
                    " declare the index once the moves have finished or been rolled back"
                )
            if not topo.index_epoch:
                raise CatalogError(
                    "this datastore predates index fences: open it once as a user that may "
                    "create tables (e.g. `schemaless init`) to upgrade it"
                )
            # Anew: a table of the name can only be left by a declaration that died
            # before recording it, perhaps with another definition; nobody writes it.
            self.cluster.create_index_tables(topo, index, fresh=True)
            self.cluster.create_fences(topo, topo.index_epoch + 1)
            info = self.cluster.catalog.record_index(index, "building", topo.index_epoch)
            if info is not None:
                break
        else:
            raise CatalogError(f"index {index.name!r}: other declarations kept racing; try again")
        now = self.cluster.refresh()
        if now.map_version != topo.map_version:  # a move finished meanwhile
            self.cluster.create_index_tables(now, index)
            self.cluster.create_fences(now, now.index_epoch)
        self.cluster.retire_fences(now)
        if info.state == "building" and self._empty(now):
            self.cluster.catalog.set_index_state(index.name, "ready", expect="building")
        return self.cluster.refresh().indexes[index.name].state

    def drop_index(self, name: str) -> None:
        """Stop maintaining an index (writers stop after their next catalog refresh)."""
        self._index_info(name)
        self.cluster.catalog.set_index_state(name, "dropped")
        self.cluster.refresh()

    def purge_index(self, name: str) -> None:
        """Remove a dropped index's tables from every shard and forget it."""
        info = self._index_info(name)
        if info.state != "dropped":
            raise IndexDefinitionError(f"index {name!r} is {info.state}: drop it before purging")
        self.cluster.drop_tables(self.cluster.current(), info.index)
        self.cluster.catalog.forget_index(name)
        self.cluster.refresh()

    def indexes(self) -> dict[str, IndexInfo]:
        """Every index in the catalog with its state."""
        return dict(self.cluster.current().indexes)

    def _index_info(self, name: str) -> IndexInfo:
        info = self.cluster.refresh().indexes.get(name)
        if info is None:
            raise IndexDefinitionError(f"no index named {name!r}")
        return info

    def _empty(self, topo: Topology) -> bool:
        """Whether no logical shard holds any entity row (tombstones included)."""
        servers = self.cluster.all_servers(topo)
        calls = {}
        for sid, server in servers.items():
            parts = [
                f"(SELECT 1 FROM {quote(topo.dbs[s], 'entities')} LIMIT 1)"
                for s in topo.shards_of(sid)
            ]
            if parts:
                sql = " UNION ALL ".join(parts) + " LIMIT 1"
                calls[sid] = Batch(server, sql)
        return all(not rows[0] for rows in gather(calls).values())

    def query(
        self,
        index: Index | str,
        *,
        order: str = "asc",
        limit: int = 20,
        cursor: str | None = None,
        include_building: bool = False,
        partial: bool = False,
        consistency: str = "primary",
        timeout: float | None = None,
        where: Mapping[str, Any] | None = None,
        **conditions: Any,
    ) -> Page:
        """One page of entities matching ``conditions`` on an index, in index order.

        Conditions are ``prop=value`` (equality; "contains" for a multi-valued
        property) or ``prop__in=[...]`` (any of the values; at most one per query,
        answered with one statement per server) on a prefix of the index's
        properties, then at most one range on the
        next property: ``prop__gt``, ``__gte``, ``__lt``, ``__lte``, ``__between=(lo,
        hi)``; a property named like a parameter of this method (``order``,
        ``limit``...) goes in ``where={...}``.  ``order`` is "asc" or "desc" (or
        "-prop"); the returned list's
        ``cursor`` fetches the next page (None when there is no more).  With
        ``partial=True`` unreachable servers are skipped and named in the page's
        ``missing_shards`` instead of raising ``ShardUnavailable`` (a server marked
        down is skipped at once).  ``timeout``: as in ``get``.
        """
        q = self._query.plan(
            index, _merge(where, conditions), order, limit, include_building, partial, consistency
        )
        return self.call(lambda: self._query.page(q, cursor), timeout)

    def get_by(
        self, index: Index | str, *, consistency: str = "primary", **values: Any
    ) -> Entity | None:
        """The one entity of a unique index with these values (every property of the
        index, by equality), or None: ``get_by("by_email", email="ada@example.com")``."""
        resolved = self.resolve_index(index, include_building=False)
        if not resolved.unique:
            raise InvalidQuery(f"index {resolved.name!r} is not unique: use query()")
        missing = [p for p in resolved.properties if p not in values]
        if missing or len(values) != len(resolved.properties):
            raise InvalidQuery(
                f"get_by on unique index {resolved.name!r} takes exactly its properties "
                f"({', '.join(resolved.properties)}) by equality"
            )
        page = self.query(resolved, limit=1, consistency=consistency, where=values)
        return page[0] if page else None

    def iter(
        self,
        index: Index | str,
        *,
        order: str = "asc",
        page_size: int = 100,
        include_building: bool = False,
        consistency: str = "primary",
        timeout: float | None = None,
        where: Mapping[str, Any] | None = None,
        **conditions: Any,
    ) -> Iterator[Entity]:
        """Every matching entity, fetched page by page (conditions as in ``query``;
        ``timeout`` is each page's deadline)."""
        q = self._query.plan(
            index,
            _merge(where, conditions),
            order,
            page_size,
            include_building,
            consistency=consistency,
        )
        return self._query.iterate(q, timeout)

    def resolve_index(self, index: Index | str, include_building: bool) -> Index:
        """Internal: the catalog's definition of an index usable by a query."""
        name = index.name if isinstance(index, Index) else index
        if not isinstance(name, str):
            raise InvalidQuery(f"expected an Index or an index name, got {type(name).__name__}")
        info = self.cluster.current().indexes.get(name)
        if info is None:
            info = self.cluster.refresh().indexes.get(name)
        if info is None:
            raise InvalidQuery(f"no index named {name!r}")
        if isinstance(index, Index) and index != info.index:
            raise InvalidQuery(f"index {name!r} in the catalog differs from the one given")
        if info.state == "dropped" or (info.state == "building" and not include_building):
            raise IndexNotReady(
                f"index {name!r} is {info.state}"
                + (
                    "; run `cleaner --index=" + name + "` or pass include_building=True"
                    if info.state == "building"
                    else ""
                )
            )
        return info.index


@functools.lru_cache(maxsize=65536)
def _get_sql(db: str) -> str:
    # Tombstones are skipped by the caller: `AND body IS NOT NULL` here cost the
    # server 8-20 µs per call (measured against the same SELECT without it).
    return f"SELECT `version`, `body` FROM {quote(db, 'entities')} WHERE `id` = %s"


def _merge(where: Mapping[str, Any] | None, conditions: dict[str, Any]) -> dict[str, Any]:
    """Conditions from ``where=`` and from keywords; a key given twice is refused."""
    if not where:
        return conditions
    twice = set(where) & set(conditions)
    if twice:
        raise InvalidQuery(f"condition given twice: {', '.join(sorted(twice))}")
    return {**where, **conditions}
