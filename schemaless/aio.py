"""An asyncio facade over :class:`schemaless.DataStore`: the same verbs, awaitable.

>>> from schemaless.aio import DataStore
>>> ds = DataStore(["127.0.0.1:3306"], indexes=[by_user])   # the sync constructor's arguments
>>> await ds.put({"id": key, "user_id": user})
>>> async for e in ds.iter("by_user", user_id=user): ...
>>> async for event in ds.changes(cursor, follow=True): ...
>>> await ds.close()

Each call runs the synchronous datastore on a bounded thread pool of ``pool_size``
workers (the size of each server's connection pool), so the event loop never blocks on
MySQL and the facade never queues for connections behind itself.

Cancellation: cancelling a call that is still waiting for a worker means it never
runs.  Cancelling a call that has started returns control at once, but the statements
already sent run to their end: **a cancelled write may still commit**.  The caller is
in the position of ``OutcomeUnknown``: read the entity again (or retry an idempotent
``put``) to learn what happened; ``expect_version`` writes stay safe to retry, a
conflict then says another write (possibly the cancelled one) got there first.
Cancelling an ``async for`` over ``changes`` loses nothing: the events it had not
handled come again from the cursor of the last one it did (at least once).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from . import store, subscriptions
from .catalog import IndexInfo
from .entity import Entity, updated
from .errors import ConflictError, DataStoreClosed
from .feed import ChangeEvent, ChangeFeed, open_feed
from .ids import id_hex, to_id
from .index import Index
from .query import Page

__all__ = ["DataStore", "Subscription"]

P = ParamSpec("P")
T = TypeVar("T")

UpdateFn = Callable[[Entity | None], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]


class DataStore:
    """The asyncio twin of :class:`schemaless.DataStore` (same constructor arguments).

    The constructor connects to the catalog, as the synchronous one does; in a running
    loop, ``await asyncio.to_thread(DataStore, ...)`` keeps the loop free meanwhile.
    ``sync`` is the underlying synchronous datastore (for ``Index.get_all`` and
    administration).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._wrap(store.DataStore(*args, **kwargs), int(kwargs.get("pool_size", 16)))

    @classmethod
    def wrap(cls, sync: store.DataStore, workers: int = 16) -> DataStore:
        """The facade over a datastore already open (``workers``: its ``pool_size``)."""
        self = cls.__new__(cls)
        self._wrap(sync, workers)
        return self

    @classmethod
    def from_env(
        cls, indexes: Sequence[Index] = (), *, create: bool = False, **kwargs: Any
    ) -> DataStore:
        """The facade over ``schemaless.DataStore.from_env`` (same arguments)."""
        sync = store.DataStore.from_env(indexes, create=create, **kwargs)
        return cls.wrap(sync, int(kwargs.get("pool_size", 16)))

    def _wrap(self, sync: store.DataStore, workers: int) -> None:
        self.sync = sync
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="schemaless-aio")

    def __repr__(self) -> str:
        return f"aio.{self.sync!r}"

    async def __aenter__(self) -> DataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, **kwargs)
        try:
            future = loop.run_in_executor(self._executor, call)
        except RuntimeError:  # the executor is shut down
            raise DataStoreClosed("the datastore is closed") from None
        return await future

    async def close(self) -> None:
        """Wait for the calls already running, then close the datastore."""
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        await asyncio.to_thread(self.sync.close)

    async def flush(self, timeout: float | None = None) -> bool:
        """See :meth:`schemaless.DataStore.flush`."""
        return await self._run(self.sync.flush, timeout)

    # -- reads and writes

    async def get(self, entity_id: bytes | Any, *, consistency: str = "primary") -> Entity | None:
        """The entity with this id, or None."""
        return await self._run(self.sync.get, entity_id, consistency=consistency)

    async def get_many(
        self, ids: Iterable[bytes | Any], *, consistency: str = "primary"
    ) -> list[Entity | None]:
        """The entities with these ids, in order (None where absent)."""
        return await self._run(self.sync.get_many, list(ids), consistency=consistency)

    async def put(
        self,
        entity: Mapping[str, Any],
        *,
        expect_version: int | None = None,
        ttl: float | None = None,
    ) -> int:
        """Store an entity; return its new version (see the module on cancellation)."""
        return await self._run(self.sync.put, entity, expect_version=expect_version, ttl=ttl)

    async def put_many(
        self, entities: Iterable[Mapping[str, Any]], *, ttl: float | None = None
    ) -> list[int]:
        """Store many entities; return their new versions in order."""
        return await self._run(self.sync.put_many, list(entities), ttl=ttl)

    async def delete(self, entity_id: bytes | Any, *, expect_version: int | None = None) -> bool:
        """Delete an entity; True if it existed."""
        return await self._run(self.sync.delete, entity_id, expect_version=expect_version)

    async def delete_many(self, ids: Iterable[bytes | Any]) -> int:
        """Delete many entities; return how many existed."""
        return await self._run(self.sync.delete_many, list(ids))

    async def update(self, entity_id: bytes | Any, fn: UpdateFn, *, retries: int = 10) -> Entity:
        """Read-modify-write with ``fn`` (a plain or an ``async`` function); on a
        conflict ``fn`` is called again, after ``retries`` conflicts ``ConflictError``."""
        key = to_id(entity_id)
        for _ in range(max(1, retries)):
            current = await self.get(key)
            version = current.version if current is not None else 0
            result = fn(Entity(current, version) if current is not None else None)
            new = updated(await result if inspect.isawaitable(result) else result, key)
            try:
                stored = await self.put(new, expect_version=version)
            except ConflictError:
                continue
            return Entity(new, stored)
        raise ConflictError(f"entity {id_hex(key)}: still conflicting after {retries} attempts")

    # -- the change feed

    def changes(
        self,
        cursor: str | None = None,
        follow: bool = False,
        *,
        snapshot: bool = False,
        part: tuple[int, int] | None = None,
    ) -> AsyncIterator[ChangeEvent]:
        """``async for event in ds.changes(...)``: the feed, arguments and order as
        :meth:`schemaless.DataStore.changes`; a round of reads per worker call, and
        ``follow`` waits on the loop, not on a worker."""
        return self._events(
            functools.partial(open_feed, self.sync.reader, cursor, snapshot=snapshot, part=part),
            follow,
        )

    async def subscribe(
        self, name: str, *, part: tuple[int, int] | None = None, snapshot: bool = False
    ) -> Subscription:
        """A named subscription (see :meth:`schemaless.DataStore.subscribe`)."""
        sync = await self._run(self.sync.subscribe, name, part=part, snapshot=snapshot)
        return Subscription(self, sync)

    async def _events(
        self, make: Callable[[], ChangeFeed], follow: bool
    ) -> AsyncIterator[ChangeEvent]:
        feed = await self._run(make)
        await self._run(feed.check_on)
        while True:
            events, more = await self._run(feed.next_round)
            for event in events:
                yield event
            if not more and not events:
                if not follow:
                    return
                await asyncio.sleep(feed.poll)

    # -- queries and indexes

    async def query(self, index: Index | str, **kwargs: Any) -> Page:
        """One page of matching entities (arguments as :meth:`schemaless.DataStore.query`)."""
        return await self._run(self.sync.query, index, **kwargs)

    async def count(self, index: Index | str, **kwargs: Any) -> int:
        """How many entities match (arguments as :meth:`schemaless.DataStore.count`)."""
        return await self._run(self.sync.count, index, **kwargs)

    async def iter(
        self, index: Index | str, *, page_size: int = 100, **kwargs: Any
    ) -> AsyncIterator[Entity]:
        """Every matching entity, a page at a time (arguments as ``DataStore.iter``)."""
        entities = await self._run(self.sync.iter, index, page_size=page_size, **kwargs)
        while True:
            chunk = await self._run(list, itertools.islice(entities, page_size))
            for entity in chunk:
                yield entity
            if len(chunk) < page_size:
                return

    async def declare_index(self, index: Index, *, force: bool = False) -> str:
        """Create an index's tables and record it; return its state."""
        return await self._run(self.sync.declare_index, index, force=force)

    async def drop_index(self, name: str) -> None:
        """Stop maintaining an index."""
        await self._run(self.sync.drop_index, name)

    async def indexes(self) -> dict[str, IndexInfo]:
        """Every index in the catalog with its state."""
        return await self._run(self.sync.indexes)


class Subscription:
    """The asyncio twin of a named subscription: ``async for event in
    sub.changes()`` resumes after what ``await sub.ack(event)`` stored."""

    def __init__(self, ds: DataStore, sync: subscriptions.Subscription) -> None:
        self._ds = ds
        self.sync = sync

    def changes(self, follow: bool = False) -> AsyncIterator[ChangeEvent]:
        """Events after the acknowledged positions (see ``DataStore.changes``)."""
        return self._ds._events(self.sync.feed, follow)

    async def ack(self, event: ChangeEvent | str) -> None:
        """Store the position after ``event`` (or a cursor)."""
        await self._ds._run(self.sync.ack, event)
