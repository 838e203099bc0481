"""The asyncio facade against the real test servers: every verb, concurrent updates,
what cancelling a pending or a running put does, and the change feed's ``async for``
(a cancelled iteration resumes from its cursor without loss)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import drop_datastore

from schemaless import (
    CatalogError,
    ConflictError,
    DataStoreClosed,
    Entity,
    Index,
    InvalidEntity,
    InvalidQuery,
    failpoints,
    new_id,
)
from schemaless import DataStore as SyncDataStore
from schemaless.aio import DataStore
from schemaless.feed import ChangeEvent
from schemaless.local import LocalCluster

BY_USER = Index("by_user", ["user_id", "n"], shard_on="user_id")


def open_ads(local_cluster: LocalCluster, **kwargs: Any) -> Iterator[DataStore]:
    ds = DataStore(
        local_cluster.addresses,
        [BY_USER],
        prefix="a_" + uuid.uuid4().hex[:12],
        shards=8,
        option_file=str(local_cluster.option_file),
        refresh_interval=0.2,
        pool_size=2,
        **kwargs,
    )
    yield ds
    drop_datastore(ds.sync)


@pytest.fixture
def ads(local_cluster: LocalCluster) -> Iterator[DataStore]:
    yield from open_ads(local_cluster)


@pytest.fixture
def fds(local_cluster: LocalCluster) -> Iterator[DataStore]:
    """With the change feed on."""
    yield from open_ads(local_cluster, changes=True)


def test_verbs(ads: DataStore) -> None:
    async def main() -> None:
        user = new_id()
        items = [{"id": new_id(), "user_id": user, "n": n} for n in range(25)]
        assert await ads.put(items[0]) > 0
        versions = await ads.put_many(items[1:])
        assert len(versions) == 24 and all(v > 0 for v in versions)
        got = await ads.get(items[3]["id"])
        assert got is not None and got["n"] == 3 and got.version == versions[2]
        assert await ads.get(new_id()) is None
        many = await ads.get_many([items[5]["id"], new_id(), items[0]["id"]])
        assert [e and e["n"] for e in many] == [5, None, 0]

        assert await ads.count(BY_USER, exact=False, user_id=user, n__gte=20) == 5
        page = await ads.query(BY_USER, user_id=user, order="desc", limit=10)
        assert [e["n"] for e in page] == list(range(24, 14, -1)) and page.cursor
        rest = await ads.query("by_user", user_id=user, order="desc", cursor=page.cursor)
        assert [e["n"] for e in rest][:2] == [14, 13]
        assert [e["n"] async for e in ads.iter(BY_USER, user_id=user, page_size=7)] == list(
            range(25)
        )
        assert [e["n"] async for e in ads.iter(BY_USER, user_id=user, n__gte=20)] == list(
            range(20, 25)
        )

        assert await ads.delete(items[0]["id"]) is True
        assert await ads.delete(items[0]["id"]) is False
        assert await ads.delete_many([items[1]["id"], items[2]["id"], new_id()]) == 2
        assert await ads.get_many([items[1]["id"]]) == [None]
        assert set(await ads.indexes()) == {"by_user"}

    asyncio.run(main())


def test_update_sync_and_async_functions_under_contention(ads: DataStore) -> None:
    async def main() -> None:
        key = new_id()
        await ads.put({"id": key, "user_id": new_id(), "n": 0})

        def bump(e: Entity | None) -> dict[str, Any]:
            assert e is not None
            return {**e, "n": e["n"] + 1}

        async def bump_later(e: Entity | None) -> dict[str, Any]:
            await asyncio.sleep(0.01)  # widen the window for conflicts
            return bump(e)

        results = await asyncio.gather(
            *(ads.update(key, bump if i % 2 else bump_later, retries=50) for i in range(8))
        )
        assert sorted(r["n"] for r in results) == list(range(1, 9))
        final = await ads.get(key)
        assert (
            final is not None
            and final["n"] == 8
            and final.version == max(r.version for r in results)
        )
        created = await ads.update(new_id(), lambda e: {"user_id": new_id(), "n": -1})
        assert created["n"] == -1 and (await ads.get(created.id)) == created
        with pytest.raises(InvalidEntity, match="must not change"):
            await ads.update(key, lambda e: {"id": new_id()})

        async def returns_nothing(e: Entity | None) -> None:
            await asyncio.sleep(0)

        with pytest.raises(InvalidEntity, match="got NoneType"):  # was a TypeError
            await ads.update(key, returns_nothing)  # type: ignore[arg-type]
        with pytest.raises(ConflictError):
            await ads.put({"id": key, "n": 0}, expect_version=1)

    asyncio.run(main())


def test_cancelling_a_pending_put_and_a_running_one(ads: DataStore) -> None:
    """Two workers, both held inside a put (after its index rows); a third put waits
    for a worker.  Cancelled, the waiting one never runs; the running one returns at
    once but commits once released (an unknown outcome for its caller)."""
    inside = threading.Semaphore(0)
    release = threading.Event()

    def hold() -> None:
        inside.release()
        assert release.wait(60)

    async def main() -> None:
        running = [{"id": new_id(), "user_id": new_id(), "n": i} for i in range(2)]
        pending = {"id": new_id(), "user_id": new_id(), "n": 9}
        failpoints.set("put.after_index_rows", hold)
        tasks = [asyncio.create_task(ads.put(e)) for e in running]
        for _ in running:  # both workers are inside a put
            assert await asyncio.to_thread(inside.acquire, True, 60)
        waiting = asyncio.create_task(ads.put(pending))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        waiting.cancel()
        tasks[0].cancel()
        for task in (waiting, tasks[0]):
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
        failpoints.clear()
        release.set()
        assert await asyncio.wait_for(tasks[1], 30) > 0
        for _ in range(600):  # the cancelled put finishes in its worker
            if await ads.get(running[0]["id"]) is not None:
                break
            await asyncio.sleep(0.05)
        found = await ads.get_many([running[0]["id"], running[1]["id"], pending["id"]])
        assert [e and e["n"] for e in found] == [0, 1, None]

    try:
        asyncio.run(main())
    finally:
        release.set()


def sync_store(local_cluster: LocalCluster, prefix: str) -> SyncDataStore:
    return SyncDataStore(
        local_cluster.addresses,
        prefix=prefix,
        shards=2,
        option_file=str(local_cluster.option_file),
    )


def test_close_waits_for_running_calls_then_refuses_new_ones(
    local_cluster: LocalCluster,
) -> None:
    prefix = "a_" + uuid.uuid4().hex[:12]
    sync = sync_store(local_cluster, prefix)

    async def main() -> None:
        async with DataStore.wrap(sync, workers=2) as ads:
            key = new_id()
            inside = threading.Event()

            def slow() -> None:
                inside.set()
                time.sleep(0.3)

            failpoints.set("put.after_index_rows", slow)
            writing = asyncio.create_task(ads.put({"id": key, "n": 1}))
            assert await asyncio.to_thread(inside.wait, 60)  # the put is running
        assert writing.done() and await writing > 0  # close() waited for it
        for call in (ads.get(key), ads.put({"id": key, "n": 2}), ads.query(BY_USER, user_id=key)):
            with pytest.raises(DataStoreClosed, match="closed") as info:
                await call
            assert not info.value.retryable

    try:
        asyncio.run(main())
    finally:
        drop_datastore(sync_store(local_cluster, prefix))


def keys(events: list[ChangeEvent]) -> list[tuple[bytes, int, int | None]]:
    return [(e.id, e.version, e.seq) for e in events]


async def until(check: Any, timeout: float = 30) -> None:
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out waiting")


def test_async_for_over_the_change_feed(fds: DataStore, ads: DataStore) -> None:
    async def main() -> None:
        items = [{"id": new_id(), "user_id": new_id(), "n": n} for n in range(30)]
        await fds.put_many(items)
        await fds.delete_many([items[0]["id"], items[1]["id"]])
        events = [e async for e in fds.changes()]
        assert keys(events) == keys(list(fds.sync.changes())) and len(events) == 32
        # in shard order, then in each shard's order: the two deletes may be on either
        assert sorted(e.id for e in events if e.deleted) == sorted(i["id"] for i in items[:2])
        rest = [e async for e in fds.changes(events[9].cursor)]
        assert keys(rest) == keys(events[10:])
        snapshot = [e async for e in fds.changes(snapshot=True)]
        assert {e.id for e in snapshot} == {i["id"] for i in items[2:]}
        halves = [[e async for e in fds.changes(part=(k, 2))] for k in range(2)]
        assert sorted(keys(halves[0] + halves[1])) == sorted(keys(events))

        seen: list[ChangeEvent] = []

        async def follow() -> None:
            async for event in fds.changes(events[-1].cursor, follow=True):
                seen.append(event)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.3)  # caught up: it polls
        assert not seen and not task.done()
        later = {"id": new_id(), "user_id": new_id(), "n": 99}
        version = await fds.put(later)
        await until(lambda: seen)
        assert [(e.id, e.version) for e in seen] == [(later["id"], version)]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        with pytest.raises(InvalidQuery):
            [e async for e in fds.changes("not a cursor")]
        with pytest.raises(CatalogError, match="change feed is off"):
            [e async for e in ads.changes()]

    asyncio.run(main())


def test_a_cancelled_iteration_resumes_from_its_cursor_without_loss(fds: DataStore) -> None:
    """Cancelled between two events of a page, and while a round of reads is running
    on a worker (held after it read): the events not handled are lost to that
    iteration only; one from the last handled event's cursor delivers them."""
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        inside.set()
        assert release.wait(60)

    async def main() -> None:
        first = [{"id": new_id(), "user_id": new_id(), "n": n} for n in range(20)]
        await fds.put_many(first)
        handled: list[ChangeEvent] = []

        async def consume(cursor: str | None, follow: bool, stop_at: int = 0) -> None:
            async for event in fds.changes(cursor, follow=follow):
                handled.append(event)
                if len(handled) == stop_at:
                    await asyncio.sleep(3600)  # the cancel lands here, mid-page

        task = asyncio.create_task(consume(None, True, stop_at=5))
        await until(lambda: len(handled) == 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        task = asyncio.create_task(consume(handled[-1].cursor, True))
        await until(lambda: len(handled) == 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sorted(e.id for e in handled) == sorted(i["id"] for i in first)

        second = [{"id": new_id(), "user_id": new_id(), "n": n} for n in range(10)]
        await fds.put_many(second)
        failpoints.set("feed.after_round", hold)
        task = asyncio.create_task(consume(handled[-1].cursor, False))
        assert await asyncio.to_thread(inside.wait, 60)  # the round read them, held
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)  # at once, the worker still held
        failpoints.clear()
        release.set()
        assert len(handled) == 20  # the held round's events never reached the loop
        rest = [e async for e in fds.changes(handled[-1].cursor)]
        assert sorted(e.id for e in rest) == sorted(i["id"] for i in second)

    try:
        asyncio.run(main())
    finally:
        release.set()


def test_a_subscription_resumes_after_its_acknowledgements(fds: DataStore) -> None:
    async def main() -> None:
        items = [{"id": new_id(), "user_id": new_id(), "n": n} for n in range(12)]
        await fds.put_many(items)
        sub = await fds.subscribe("aio-test")
        got = []
        async for event in sub.changes():
            got.append(event)
            if len(got) <= 7:
                await sub.ack(event)
        assert len(got) == 12
        again = await fds.subscribe("aio-test")  # as a restarted consumer
        assert keys([e async for e in again.changes()]) == keys(got[7:])
        with pytest.raises(InvalidQuery, match="subscription name"):
            await fds.subscribe("no spaces")

    asyncio.run(main())
