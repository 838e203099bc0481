"""The datastore: put, get, delete, update and their batch forms, index lifecycle and
queries.  Writes run the protocol of ``schemaless.protocol``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from . import counting, counts, failpoints, fit
from .catalog import IndexInfo, IndexState, Topology
from .clock import VersionClock
from .cluster import Cluster
from .codec import Codec, train_dictionary
from .connection import ConnectOptions, Retry, Tracer
from .dsn import Address, Credentials, parse_address
from .entity import Entity, updated
from .errors import (
    CatalogError,
    ConflictError,
    IndexDefinitionError,
    IndexDoesNotFit,
    InvalidEntity,
    InvalidQuery,
    PermissionDenied,
    UniqueViolation,
)
from .expiry import check_property, expired, stamp
from .feed import ChangeEvent, enable_changes, open_feed
from .follow import Calls
from .health import HealthState
from .ids import id_hex, to_id
from .index import Index
from .locate import locate
from .names import quote
from .owned import LAYOUTS, OWNED, shards_sql
from .protocol import Writer
from .query import Page, QueryEngine
from .reader import Reader
from .scatter import bare, server_reads
from .subscriptions import Subscription
from .writes import BLIND, CREATE, WriteMode

__all__ = ["DataStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_DECLARE_ATTEMPTS = 5  # declarations racing each other for the next index epoch


class DataStore:
    """Schemaless entities on sharded MySQL/MariaDB servers.

    ``DataStore(mysql_shards=["127.0.0.1:3306", "127.0.0.1:3307"], indexes=[...])``
    opens the datastore whose catalog is on the first server, initialising one with
    ``shards`` logical shards (default 64) if there is none yet.  ``timeout``: every
    call returns or raises within this many seconds (default ``read_timeout``).
    ``force_indexes``: declare new ``indexes`` even when the stored entities do not fit
    them (``declare_index(force=True)``); without it such an index raises
    ``IndexDoesNotFit``.  ``layout``: how a new datastore stores its shards, ``"owned"``
    (one table per server, the shard a column: the default) or ``"databases"`` (a
    database per logical shard, the layout before 0.13); an existing one keeps its own.
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
        expire_on: str | None = None,
        changes: bool = False,
        force_indexes: bool = False,
        layout: str = OWNED,
    ) -> None:
        addresses, creds = _checked(mysql_shards, user, password, option_file, timeout, layout)
        options = ConnectOptions(
            credentials=creds,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            pool_size=pool_size,
            ssl=ssl,
            retry=retry or Retry(),
        )
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
            layout=layout,
        )
        self._assemble(read_timeout if timeout is None else timeout, move_wait, claim_wait)
        self._record(expire_on, changes, indexes, force_indexes)

    def _assemble(self, deadline: float, move_wait: float, claim_wait: float) -> None:
        """The facade's parts over its cluster: each call's deadline (``timeout``, by
        default ``read_timeout``) and the map it follows, reads, writes, queries."""
        self.codec, self.clock = self.cluster.codec, VersionClock()
        self.calls = Calls(self.cluster, deadline, move_wait)
        self.reader = Reader(self.cluster, self.codec, self.calls)
        self._writer = Writer(self.cluster, self.codec, self.clock, self.reader.decode)
        self.claims = self._writer.claims  # internal: the Cleaner's backfill claims too
        self.claims.wait = claim_wait
        self._query = QueryEngine(self.cluster, self.reader, self.calls)

    @classmethod
    def from_env(
        cls,
        indexes: Sequence[Index] = (),
        *,
        create: bool = False,
        url: str | None = None,
        prefix: str | None = None,
        local_dir: str | None = None,
        **kwargs: Any,
    ) -> DataStore:
        """The datastore the ``schemaless`` CLI opens: ``$SCHEMALESS_URL`` (the catalog
        server; credentials from it, ``$SCHEMALESS_USER``/``$SCHEMALESS_PASSWORD`` or
        ``$SCHEMALESS_OPTION_FILE``), else the local cluster that ``schemaless local up``
        or ``make demo`` started (``$SCHEMALESS_LOCAL_DIR`` or ``./.schemaless-local``),
        with its option file; prefix ``$SCHEMALESS_PREFIX`` or ``schemaless``.

        ``create=True`` initialises the datastore if there is none yet (with
        ``shards=``, default 64, fixed once made; on every local server, or on the
        URL's server alone); otherwise a missing one raises ``CatalogError``.
        ``url=``, ``prefix=`` and ``local_dir=`` override the environment; other
        arguments are the constructor's."""
        found, options = locate(url, prefix=prefix, create=create, local_dir=local_dir)
        return cls(found, indexes, create=create, **{**options, **kwargs})

    def _record(
        self, expire_on: str | None, changes: bool, indexes: Sequence[Index], force: bool
    ) -> None:
        """What the constructor's arguments ask of the catalog: the expiry property,
        the change feed, the indexes (``force``: declared even if the stored entities
        do not fit them)."""
        if expire_on is not None:
            self._expire_on(check_property(expire_on))
        if changes:
            enable_changes(self.cluster)
        known = self.cluster.topology  # just loaded; one declared since is found again
        for index in indexes:  # one the catalog has needs its server only
            if self._declared(index, known, finish=False) is None:
                self.declare_index(index, force=force)

    @property
    def timeout(self) -> float:
        """Every call returns or raises within this many seconds (plus a small margin):
        by default read_timeout.  Most calls take their own ``timeout=`` too."""
        return self.calls.timeout

    @property
    def move_wait(self) -> float:
        """How long a call waits for a move under way before it fails."""
        return self.calls.move_wait

    def _expire_on(self, prop: str) -> None:
        """Record the expiry property in the catalog, unless it names another one."""
        self.cluster.catalog.set_expire_on(prop, replace=False)
        recorded = self.cluster.refresh().expire_on
        if recorded != prop:
            raise CatalogError(
                f"datastore {self.cluster.topology.prefix!r} expires entities on "
                f"{recorded!r}, not {prop!r}; change it with `schemaless expiry {prop}`"
            )

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
        return self.calls.call(lambda: self.reader.get(key, consistency), timeout)

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
        with self.calls.deadline(timeout):
            return self.reader.get_many(keys, consistency)

    def decode(self, entity_id: bytes, shard: int | None, version: int, body: bytes) -> Entity:
        """Internal: ``Reader.decode``."""
        return self.reader.decode(entity_id, shard, version, body)

    # -- writes --------------------------------------------------------------------------

    def put(
        self,
        entity: Mapping[str, Any],
        *,
        expect_version: int | None = None,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> int:
        """Store an entity; return its new version.

        An entity without an ``id`` gets a new one (written into the dict).
        ``expect_version``: the version read earlier (0: the entity must not exist, or
        has expired); if the stored version differs, raise ``ConflictError`` and write
        nothing that a reader could see.  ``ttl``: expire the entity this many seconds
        from now (written into the dict's expiry property, see ``expire_on``).
        ``timeout``: as in ``get``.
        """
        if expect_version is not None and (
            not isinstance(expect_version, int) or expect_version < 0
        ):
            raise InvalidEntity(f"expect_version must be an int >= 0, got {expect_version!r}")
        stamp([entity], self.cluster.topology.expire_on, ttl)
        mode = CREATE if expect_version == 0 else BLIND
        if expect_version:
            mode = WriteMode.expect(expect_version)
        return self.calls.call(lambda: self._put(entity, mode), timeout)

    def _put(self, entity: Mapping[str, Any], mode: WriteMode) -> int:
        """One write; a create over an expired entity not yet purged replaces it."""
        try:
            return self._writer.write([entity], mode)[0]
        except ConflictError:
            if mode != CREATE:
                raise
            stored = self.reader.stored(to_id(entity["id"]), "primary")
            if stored is None or not expired(stored, self.cluster.topology.expire_on):
                raise
            return self._writer.write([entity], WriteMode.expect(stored.version))[0]

    def put_many(
        self,
        entities: Iterable[Mapping[str, Any]],
        *,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> list[int]:
        """Store many entities (last writer wins); return their new versions in order.

        Each step is one statement batch per server, servers in parallel; a batch that
        would not fit in the servers' max_allowed_packet is written in parts, in turn.
        ``ttl``: as in ``put``, for every entity.
        """
        batch = list(entities)
        stamp(batch, self.cluster.topology.expire_on, ttl)
        return self.calls.call(lambda: self._writer.write(batch, BLIND), timeout)

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
        mode = BLIND if expect_version is None else WriteMode.expect(expect_version)
        key = to_id(entity_id)
        return self.calls.call(lambda: self._writer.delete([key], mode), timeout) == 1

    def delete_many(self, ids: Iterable[bytes | Any], *, timeout: float | None = None) -> int:
        """Delete many entities; return how many existed."""
        keys = list(dict.fromkeys(to_id(i) for i in ids))
        return self.calls.call(lambda: self._writer.delete(keys, BLIND), timeout) if keys else 0

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
        with self.calls.deadline(timeout):
            return self._update(to_id(entity_id), fn, retries)

    def _update(
        self, key: bytes, fn: Callable[[Entity | None], Mapping[str, Any]], retries: int
    ) -> Entity:
        for _ in range(max(1, retries)):
            current = self.calls.call(lambda: self.reader.stored(key, "primary"))
            version = current.version if current is not None else 0  # expired: replaced
            if current is not None and expired(current, self.cluster.topology.expire_on):
                current = None
            new = updated(fn(Entity(current, version) if current is not None else None), key)
            failpoints.hit("update.before_put")
            try:
                stored = self.put(new, expect_version=version)
            except UniqueViolation:
                raise  # calling fn again would claim the same value
            except ConflictError:
                continue
            return Entity(new, stored)
        raise ConflictError(f"entity {id_hex(key)}: still conflicting after {retries} attempts")

    def rerouted(self, fn: Callable[[], T]) -> T:
        """Internal: ``Calls.rerouted``: ``fn``, following the map after a move."""
        return self.calls.rerouted(fn)

    def train_dictionary(self, samples: int = 5000, size: int = 16384) -> int:
        """Train a zstd dictionary on stored entities, store it in the catalog and use it
        for new bodies (old bodies name their own dictionary); return its id."""
        entities = self.reader.newest(samples)
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
        partial: bool = False,
    ) -> Iterator[ChangeEvent]:
        """The change feed (``DataStore(changes=True)``): events in each logical shard's
        commit order, per entity in increasing version order, deletes included
        (``event.entity`` None), at least once; each ``event.cursor`` resumes after it.
        ``cursor`` None: from the oldest change kept, or, with ``snapshot``, every live
        entity first and then the changes since.  Without ``follow`` it ends once it has
        caught up.  ``part=(k, n)``: the logical shards with ``shard % n == k``.
        ``partial``: a server that does not answer is left out of each round (its shards'
        positions kept in the cursors, so they resume from there), not raised."""
        feed = open_feed(self.reader, cursor, snapshot=snapshot, part=part, partial=partial)
        return feed.events(follow)

    def subscribe(
        self, name: str, *, part: tuple[int, int] | None = None, snapshot: bool = False
    ) -> Subscription:
        """A named consumer whose positions live in the catalog: ``sub.changes()``
        resumes after what ``sub.ack(event)`` acknowledged, also after a restart; a new
        one starts from the oldest change kept, or with a snapshot."""
        return Subscription(self.reader, name, part, snapshot)

    def declare_index(self, index: Index, *, force: bool = False) -> str:
        """Create an index's tables and record it; return its state.

        On a datastore with no entities the index is ``ready`` at once; otherwise it is
        ``building`` until ``cleaner --index=NAME`` has backfilled it.  Declaring the
        same definition again is a no-op (for a ``building`` index it also finishes an
        interrupted declaration); a different one under the name is an error.

        A new index over stored entities is first checked against a sample of them
        (``schemaless.fit``): values that do not fit its types or, for a unique index,
        that repeat raise ``IndexDoesNotFit`` (with counts and examples) and nothing is
        declared, unless ``force``.  Such an index stays building until the data is
        fixed (docs/architecture.md, "Declaring an index over data that does not fit").

        The declaration moves the index epoch on: the next epoch's fence tables first,
        then the index with the new epoch in the catalog, then the old fences dropped.
        Each drop waits for the writes in flight that named it; a later write from a
        map without the index fails, refreshes and writes again with it (``rerouted``).
        """
        if not isinstance(index, Index):
            raise IndexDefinitionError(f"expected an Index, got {type(index).__name__}")
        topo = self.cluster.refresh()
        if index.counted:
            counts.need_owned(topo, f"counted index {index.name!r}")
        state = self._declared(index, topo)  # no lock for a known one
        if state is not None:
            return state
        if not force and not topo.moves:  # during a move it is refused below
            found = fit.sample(self.cluster, self.reader.decode, index)
            if not found.fits:
                raise IndexDoesNotFit(found.summary(), found.examples())
        busy = "another client is declaring an index of this datastore"
        with self.cluster.catalog.lock("declare", busy, wait=20):
            return self._declare(index)

    def _declared(self, index: Index, topo: Topology, *, finish: bool = True) -> str | None:
        """The state of ``index`` if the catalog has it (with ``finish``, finishing a
        declaration that died: that needs every server, so opening leaves it to
        ``declare_index``); None if it has no index of that name; an error if another
        definition."""
        existing = topo.indexes.get(index.name)
        if existing is None:
            return None
        if existing.index != index:
            raise IndexDefinitionError(
                f"index {index.name!r} already exists with a different definition: "
                f"{existing.index!r}; drop and purge it first"
            )
        if existing.state == IndexState.DROPPED:
            raise IndexDefinitionError(
                f"index {index.name!r} was dropped; purge it before declaring it again"
            )
        if finish and existing.state == IndexState.BUILDING:  # a declaration that died
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
            # With entities to backfill, KEY by_entity is built when the backfill ends.
            keyed = self._empty(topo)
            self.cluster.create_index_tables(topo, index, fresh=True, entity_key=keyed)
            self.cluster.create_fences(topo, topo.index_epoch + 1)
            info = self.cluster.catalog.record_index(index, IndexState.BUILDING, topo.index_epoch)
            if info is not None:
                break
        else:
            raise CatalogError(f"index {index.name!r}: other declarations kept racing; try again")
        now = self.cluster.refresh()
        if now.map_version != topo.map_version:  # a move finished meanwhile
            self.cluster.create_index_tables(now, index)
            self.cluster.create_fences(now, now.index_epoch)
        self.cluster.retire_fences(now)
        if info.state == IndexState.BUILDING and self._empty(now):
            if not keyed:  # its entities went meanwhile (purged tombstones)
                self.cluster.add_entity_keys(now, index)
            self.cluster.catalog.set_ready(index.name)
        return self.cluster.refresh().indexes[index.name].state

    def drop_index(self, name: str) -> None:
        """Stop maintaining an index (writers stop after their next catalog refresh)."""
        self._index_info(name)
        self.cluster.catalog.set_index_state(name, IndexState.DROPPED)
        self.cluster.refresh()

    def purge_index(self, name: str) -> None:
        """Remove a dropped index's tables from every shard and forget it."""
        info = self._index_info(name)
        if info.state != IndexState.DROPPED:
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
        reads = server_reads(
            topo,
            lambda db, s: f"SELECT 1 FROM {quote(db, 'entities')} WHERE {shards_sql(s)} LIMIT 1",
            lambda s: f"(SELECT 1 FROM {quote(topo.dbs[s], 'entities')} LIMIT 1)",
            " LIMIT 1",
        )
        found = self.cluster.scatter(topo, reads, bare).results
        return all(not rows[0] for rows in found.values())

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
        properties, then at most one range on the next property: ``prop__gt``,
        ``__gte``, ``__lt``, ``__lte``, ``__between=(lo, hi)``, or ``__startswith``
        (a prefix, on a str(N) or bytes(N) column); a property named like a parameter
        of this method (``order``, ``limit``...) goes in ``where={...}``.  ``order`` is
        "asc" or "desc" (or "-prop"); the returned list's ``cursor`` fetches the next
        page (None when there is no more).  With ``partial=True`` unreachable servers
        are skipped and named in the page's
        ``missing_shards`` instead of raising ``ShardUnavailable`` (a server marked
        down is skipped at once).  ``timeout``: as in ``get``.
        """
        q = self._query.plan(
            index, _merge(where, conditions), order, limit, include_building, partial, consistency
        )
        return self.calls.call(lambda: self._query.page(q, cursor), timeout)

    def count(
        self,
        index: Index | str,
        *,
        exact: bool = True,
        timeout: float | None = None,
        where: Mapping[str, Any] | None = None,
        **conditions: Any,
    ) -> int:
        """How many entities match: ``ds.count("likes_by_entry", entry_id=e)``.

        ``exact=True``: equality (or one ``__in`` list) on a prefix of a counted index's
        properties (``Index(..., counted=True)``), none to count every entity it holds;
        read from the counters step 2 keeps (one statement per server, no entity
        read).  ``exact=False``: any index and any conditions of ``query``, the matching
        index rows (an upper bound: an entity with several rows, orphan and stale rows
        count; a committed match is never missed).  Owned layout only;
        docs/architecture.md, "Counts".  ``timeout``: as in ``get``."""
        merged = _merge(where, conditions)
        return self.calls.call(lambda: counting.count(self._query, index, merged, exact), timeout)

    def get_by(
        self, index: Index | str, *, consistency: str = "primary", **values: Any
    ) -> Entity | None:
        """The one entity of a unique index with these values (every property of the
        index, by equality), or None: ``get_by("by_email", email="ada@example.com")``."""
        resolved = self._query.resolve(index, include_building=False)
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


def _checked(
    specs: Sequence[str] | str,
    user: str | None,
    password: str | None,
    option_file: str | None,
    timeout: float | None,
    layout: str,
) -> tuple[list[Address], Credentials]:
    """The constructor's arguments, refused before any server is touched when bad: the
    servers' addresses and credentials (``_servers``)."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if layout not in LAYOUTS:
        raise CatalogError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return _servers(specs, Credentials.resolve(user, password, option_file))


def _servers(specs: Sequence[str] | str, creds: Credentials) -> tuple[list[Address], Credentials]:
    """The servers' addresses, and the credentials (those of the first address, where
    it names any, over ``creds``)."""
    parsed = [parse_address(spec) for spec in ([specs] if isinstance(specs, str) else specs)]
    if parsed:
        creds = parsed[0][1].merged(creds)
    return [address for address, _ in parsed], creds


def _merge(where: Mapping[str, Any] | None, conditions: dict[str, Any]) -> dict[str, Any]:
    """Conditions from ``where=`` and from keywords; a key given twice is refused."""
    if where is not None and not isinstance(where, Mapping):
        raise InvalidQuery(
            f"where= takes a mapping of conditions ({{'published__gt': t}}), "
            f"not a {type(where).__name__}"
        )
    if not where:
        return conditions
    twice = set(where) & set(conditions)
    if twice:
        raise InvalidQuery(f"condition given twice: {', '.join(sorted(twice))}")
    return {**where, **conditions}
