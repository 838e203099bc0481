"""The query invariants checked live: readers query while writers churn the same index
ranges and a Cleaner repairs, fences and purges under them."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import assert_clean, same_store

from schemaless import DataStore, Index, IndexNotReady, new_id
from schemaless.cleaner import Cleaner
from schemaless.cleaner.scan import entity_batches
from schemaless.local import LocalCluster
from schemaless.move import ShardMover

BY_USER = Index("by_user", {"user": "int", "published": "int"}, shard_on="user")
BY_TAG = Index("by_tag", {"tags": "str(8)", "published": "int"}, shard_on="tags", multi="tags")
USERS, TAGS = 3, ["a", "b", "c", "d"]
SECONDS = 4.0
WORDS = ["timeline", "entity", "shard", "cleaner", "index", "replica", "cursor", "fence"]


def _random_entity(rnd: random.Random, key: bytes) -> dict[str, Any]:
    return {
        "id": key,
        "user": rnd.randrange(USERS),
        "published": rnd.randrange(6),  # few values: ties, and values that come back
        "tags": rnd.sample(TAGS, rnd.randrange(3)),
        "text": " ".join(rnd.choice(WORDS) for _ in range(12)),  # a body worth compressing
    }


def _pick(
    r: random.Random,
) -> tuple[Index, dict[str, Any], Callable[[dict[str, Any]], bool]]:
    """A query: its index, its condition, and what matching it means."""
    if r.random() < 0.5:
        user = r.randrange(USERS)
        return BY_USER, {"user": user}, lambda e: e["user"] == user
    tag = r.choice(TAGS)
    return BY_TAG, {"tags": tag}, lambda e: tag in e["tags"]


def _run(
    threads: dict[str, Callable[[threading.Event], None]],
    seconds: float,
    enough: Callable[[], bool] = lambda: True,
) -> None:
    """Run the workers until ``seconds`` have passed and they did ``enough`` (up to ten
    times as long: a loaded machine is slower, not wrong); re-raise the first failure."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(fn: Callable[[threading.Event], None]) -> None:
        try:
            fn(stop)
        except BaseException as exc:  # re-raised by the main thread
            errors.append(exc)
            stop.set()

    running = [threading.Thread(target=guarded, args=(fn,), name=n) for n, fn in threads.items()]
    for t in running:
        t.start()
    stop.wait(seconds)
    deadline = time.monotonic() + 9 * seconds
    while not stop.is_set() and not enough() and time.monotonic() < deadline:
        stop.wait(0.1)
    stop.set()
    for t in running:
        t.join()
    if errors:
        raise errors[0]


class Acks:
    """What the writers acknowledged, per key: a counter that is odd while a write of
    the key is in flight, and the value of its last acknowledged write (None: deleted)."""

    def __init__(self, entities: list[dict[str, Any]]) -> None:
        self._lock = threading.Lock()
        self._seq = {e["id"]: 0 for e in entities}
        self._value: dict[bytes, dict[str, Any] | None] = {e["id"]: e for e in entities}

    def begin(self, keys: list[bytes]) -> None:
        with self._lock:
            for key in keys:
                self._seq[key] += 1

    def end(self, values: dict[bytes, dict[str, Any] | None]) -> None:
        with self._lock:
            for key, value in values.items():
                self._value[key] = value
                self._seq[key] += 1

    def snapshot(self) -> dict[bytes, int]:
        """The counters of the keys with no write in flight."""
        with self._lock:
            return {k: n for k, n in self._seq.items() if n % 2 == 0}

    def untouched(self, before: dict[bytes, int]) -> list[dict[str, Any]]:
        """The live values of the keys not written since ``before`` was taken."""
        with self._lock:
            return [
                value
                for key, n in before.items()
                if self._seq[key] == n and (value := self._value[key]) is not None
            ]


@pytest.mark.parametrize("also", ["", "moves", "backfill", "dictionaries"])
def test_queries_during_writes_and_cleaner_passes(
    make_store: Any, local_cluster: LocalCluster, also: str
) -> None:
    """While 3 writers put, update (values that change and change back), delete and
    recreate entities, a Cleaner fences at once and purges tombstones (and, ``also``,
    logical shards move back and forth between the servers, or the multi-valued index
    is declared when the test starts and the Cleaner only backfills it, or new codec
    dictionaries are trained and put to use by one client), every query
    (iterated in pages of 2):

    * returns only entities that match it on the values returned;
    * returns, exactly once, every match whose last write was acknowledged before the
      query started and that no write touched until it ended;
    * returns its entities in index order.

    At the end every stored entity is the last write acknowledged for it.
    """
    store = make_store(indexes=[BY_USER] if also == "backfill" else [BY_USER, BY_TAG])
    rnd = random.Random(7)
    entities = [_random_entity(rnd, new_id()) for _ in range(100)]
    store.put_many(entities)
    if also == "backfill":
        assert store.declare_index(BY_TAG) == "building"
    if also == "dictionaries":  # enough bodies to train on, in no index
        store.put_many({"id": new_id(), "note": f"filler {i} " * 8} for i in range(150))
    acks = Acks(entities)
    churn = [e["id"] for e in entities[:45]]  # the other 55 are never written again
    clients: list[DataStore] = []
    churned = set(churn)
    counts = dict.fromkeys(("writes", "queries", "passes", "checked", "churned", "moves"), 0)
    counts.update(
        building=0, by_user=0, by_tag=0, dictionaries=0
    )  # building: refused, not ready yet

    def client() -> DataStore:
        other = same_store(local_cluster, store)
        clients.append(other)
        return other

    def writer(seed: int) -> Callable[[threading.Event], None]:
        mine = churn[seed::3]  # one writer per key: its last write is the key's value

        def run(stop: threading.Event) -> None:
            w, r = client(), random.Random(seed)
            while not stop.is_set():
                key, op = r.choice(mine), r.random()
                if op < 0.15:
                    acks.begin([key])
                    w.delete(key)
                    acks.end({key: None})
                elif op < 0.45:  # recreate if deleted, then change some values
                    acks.begin([key])
                    w.update(key, lambda e, key=key: {**_random_entity(r, key), **(e or {})})
                    new = w.update(key, lambda e, key=key: {**(e or {}), **_random_entity(r, key)})
                    acks.end({key: dict(new)})
                elif op < 0.6:
                    batch = [_random_entity(r, k) for k in r.sample(mine, 3)]
                    acks.begin([e["id"] for e in batch])
                    w.put_many(batch)
                    acks.end({e["id"]: e for e in batch})
                else:
                    entity = _random_entity(r, key)
                    acks.begin([key])
                    w.put(entity)
                    acks.end({key: entity})
                counts["writes"] += 1

        return run

    def cleaner(stop: threading.Event) -> None:
        c = Cleaner(client(), batch=50, tombstone_retention=0.3, fence_after=0.0)
        if also == "backfill":  # only: a pass after it would repair what it missed
            assert c.backfill("by_tag") == "ready"
            return
        while not stop.is_set():
            c.run_once()
            counts["passes"] += 1

    def mover(stop: threading.Event) -> None:
        m, home = ShardMover(store, chunk=20), store.cluster.current()
        for shard in itertools.cycle(range(home.n_shards)):
            if stop.is_set():
                return
            here = store.cluster.current().shard_servers[shard]
            m.move(shard, next(sid for sid in home.servers if sid != here))
            counts["moves"] += 1

    def trainer(stop: threading.Event) -> None:
        t = client()
        for _ in range(2):
            if stop.wait(1.0):
                return
            t.train_dictionary(samples=400, size=2048)
            t.put({"note": "a body in the new dictionary " * 4})
            counts["dictionaries"] += 1

    def reader(seed: int) -> Callable[[threading.Event], None]:
        def run(stop: threading.Event) -> None:
            q, r = client(), random.Random(100 + seed)
            while not stop.is_set():
                order = r.choice(["asc", "desc"])
                index, condition, matches = _pick(r)
                before = acks.snapshot()
                try:
                    got = list(q.iter(index, page_size=2, order=order, **condition))
                except IndexNotReady:
                    assert also == "backfill"
                    counts["building"] += 1
                    continue
                assert all(matches(e) for e in got), "a non-match was returned"
                want = {e["id"] for e in acks.untouched(before) if matches(e)}
                found = sorted(e["id"] for e in got if e["id"] in want)
                assert found == sorted(want), "a match was missed or repeated"
                keys = [(e["published"], e["id"]) for e in got]
                assert keys == sorted(keys, reverse=order == "desc"), "out of index order"
                assert len(set(keys)) == len(keys), "an entity returned twice at one place"
                counts["queries"] += 1
                counts[index.name] += 1
                counts["checked"] += len(want)
                counts["churned"] += len(want & churned)

        return run

    try:
        _run(
            {
                **{f"writer{i}": writer(i) for i in range(3)},
                **{f"reader{i}": reader(i) for i in range(2)},
                "cleaner": cleaner,
                **({"mover": mover} if also == "moves" else {}),
                **({"trainer": trainer} if also == "dictionaries" else {}),
            },
            SECONDS,
            lambda: (
                counts["writes"] > 100
                and counts["queries"] > 20
                and counts["by_tag"] > 10
                and counts["churned"] > 100
                and (counts["passes"] >= 2 or also == "backfill")
                and (counts["moves"] >= 2 or also != "moves")
            ),
        )
    finally:
        for c in clients:
            c.close()
    assert counts["writes"] > 100 and counts["queries"] > 20, counts
    assert counts["passes"] >= 2 if also != "backfill" else counts["passes"] == 0, counts
    assert counts["moves"] >= 2 if also == "moves" else counts["moves"] == 0, counts
    assert counts["building"] > 0 if also == "backfill" else counts["building"] == 0, counts
    assert counts["by_tag"] > 10, counts  # (a backfilled index: queried once ready)
    assert counts["dictionaries"] == (2 if also == "dictionaries" else 0), counts
    if also == "dictionaries":  # the writers took the new dictionaries up as they went
        topo = store.cluster.refresh()
        named = {
            store.codec.dictionary_id(body)
            for shard in range(topo.n_shards)
            for batch in entity_batches(store, topo, shard)
            for _, _, _, body in batch
            if body is not None
        }
        assert set(topo.dictionary_ids) <= named, (named, topo.dictionary_ids)
    if also == "moves":
        assert ShardMover(store).drop_old_copies()
    Cleaner(store, tombstone_retention=0.0, fence_after=0.0).run_once()
    assert_clean(store)
    # every acknowledged write is what is stored, and the reads above checked something
    final = acks.untouched(acks.snapshot())
    stored = store.get_many([e["id"] for e in entities])
    assert {e["id"]: e for e in final} == {e["id"]: dict(e) for e in stored if e is not None}
    assert counts["checked"] > 10 * counts["queries"] and counts["churned"] > 100, counts
