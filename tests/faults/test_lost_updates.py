"""The popular album everyone likes: many threads in two clients doing read-modify-write
on one hot entity.  The final count equals the number of acknowledged updates, each
acknowledged update saw a different count, and the indexes stay exact."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from schemaless import ConflictError, DataStore, Entity, Index, failpoints, new_id
from schemaless.cleaner.daemon import Cleaner
from schemaless.cleaner.verify import diff_indexes
from schemaless.local import LocalCluster

BY_LIKES = Index("by_likes", {"likes": "int"})
BY_FAN = Index("by_fan", {"fans": "str(8)"}, multi="fans")

CLIENTS = 2
THREADS = 5  # per client
UPDATES = 20  # per thread


@pytest.fixture
def widen_the_race() -> Iterator[None]:
    """Sleep a little between the read and the write of every update()."""
    rng = random.Random(1)
    failpoints.set("update.before_put", lambda: time.sleep(rng.random() / 500))
    yield
    failpoints.clear("update.before_put")


def like(fan: str, calls: list[int]) -> Any:
    def change(album: Entity | None) -> dict[str, Any]:
        assert album is not None
        calls.append(1)
        fans = [*[f for f in album["fans"] if f != fan][-5:], fan]
        return {**album, "likes": album["likes"] + 1, "fans": fans}

    return change


def test_concurrent_likes_lose_nothing(
    make_store: Any, local_cluster: LocalCluster, widen_the_race: None
) -> None:
    store = make_store(indexes=[BY_LIKES, BY_FAN])
    others = [
        DataStore(
            local_cluster.addresses,
            option_file=str(local_cluster.option_file),
            prefix=store.cluster.topology.prefix,
            create=False,
        )
        for _ in range(CLIENTS - 1)
    ]
    key = new_id()
    store.put({"id": key, "title": "popular album", "likes": 0, "fans": []})
    acked: list[int] = []
    gave_up: list[ConflictError] = []
    errors: list[BaseException] = []
    calls: list[int] = []
    lock = threading.Lock()

    def fan(client: DataStore, name: str) -> None:
        for _ in range(UPDATES):
            try:
                stored = client.update(key, like(name, calls), retries=200)
            except ConflictError as exc:
                with lock:
                    gave_up.append(exc)
                continue
            except BaseException as exc:
                errors.append(exc)
                return
            with lock:
                acked.append(stored["likes"])

    threads = [
        threading.Thread(target=fan, args=(client, f"f{c}{t}"))
        for c, client in enumerate([store, *others])
        for t in range(THREADS)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        for other in others:
            other.close()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    album = store.get(key)
    assert album is not None
    assert album["likes"] == len(acked) == CLIENTS * THREADS * UPDATES - len(gave_up)
    assert sorted(acked) == list(range(1, len(acked) + 1))  # each saw a different count
    assert len(calls) > len(acked), "no conflict: the race was not exercised"
    assert [e.id for e in store.query(BY_LIKES, likes=album["likes"])] == [key]
    assert not store.query(BY_LIKES, likes__lt=album["likes"])
    for name in album["fans"]:
        assert [e.id for e in store.query(BY_FAN, fans=name)] == [key]
    for diff in diff_indexes(store).values():
        assert not diff.missing and not diff.behind
    Cleaner(store, fence_after=0).run_once()
    assert all(d.clean for d in diff_indexes(store).values())
