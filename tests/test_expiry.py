"""Expiry (TTL): reads never return an expired entity, the Cleaner deletes expired
entities guarded by the version it saw, and a re-put always wins."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import uuid
from typing import Any

import pytest
from conftest import assert_clean, same_store
from test_grants import new_users, open_as

from schemaless import DataStore, Index, failpoints
from schemaless.aio import DataStore as AsyncDataStore
from schemaless.cleaner import Cleaner
from schemaless.cleaner.access import read_entities
from schemaless.errors import CatalogError, InvalidEntity
from schemaless.expiry import check_property, expired, stamp
from schemaless.grants import apply_grants
from schemaless.ids import new_id
from schemaless.local import LocalCluster

BY_KIND = Index("by_kind", {"kind": "str(20)", "n": "int"})
BY_EXP = Index("by_exp", {"exp": "float"})


# -- pure ---------------------------------------------------------------------------------


def test_expired_compares_the_property_with_the_clock() -> None:
    assert expired({"exp": 10}, "exp", now=10)
    assert expired({"exp": 9.5}, "exp", now=10)
    assert not expired({"exp": 10.5}, "exp", now=10)
    assert not expired({"exp": None}, "exp", now=10)
    assert not expired({}, "exp", now=10)
    assert not expired({"exp": 1}, None, now=10)  # no expiry property: never
    assert not expired({"exp": True}, "exp", now=10)  # not a number: never
    assert expired({"exp": time.time() - 1}, "exp")


@pytest.mark.parametrize("ttl", [0, -1, "5", True, math.nan, math.inf, [1]])
def test_stamp_refuses_a_bad_ttl_and_changes_nothing(ttl: Any) -> None:
    entity: dict[str, Any] = {"a": 1}
    with pytest.raises(InvalidEntity, match="ttl"):
        stamp([entity], "exp", ttl)
    assert entity == {"a": 1}


def test_stamp_sets_every_entity_or_none() -> None:
    with pytest.raises(InvalidEntity, match="expiry property"):
        stamp([{"a": 1}], None, 5)  # a ttl needs an expiry property
    good, bad = {"exp": 1}, {"exp": "tomorrow"}
    with pytest.raises(InvalidEntity, match="epoch seconds"):
        stamp([good, bad], "exp", None)
    before = time.time()
    entities: list[dict[str, Any]] = [{"a": 1}, {"a": 2}]
    stamp(entities, "exp", 2.5)
    assert all(before + 2.5 <= e["exp"] <= time.time() + 2.5 for e in entities)


def test_check_property() -> None:
    assert check_property("expires_at") == "expires_at"
    for bad in ("id", "a b", "", 3, "x;drop"):
        with pytest.raises(InvalidEntity):
            check_property(bad)


# -- the datastore ------------------------------------------------------------------------


def _store(make_store: Any, indexes: tuple[Index, ...] = (BY_KIND,)) -> DataStore:
    store: DataStore = make_store(indexes, expire_on="exp")
    return store


def test_reads_never_return_expired_entities(make_store: Any, local_cluster: LocalCluster) -> None:
    store = _store(make_store, (BY_KIND, BY_EXP))
    now = time.time()
    live = [{"kind": "k", "n": i, "exp": now + 3600} for i in range(0, 20, 2)]
    dead = [{"kind": "k", "n": i, "exp": now - 1} for i in range(1, 20, 2)]
    forever = {"kind": "k", "n": 100}
    store.put_many([*live, *dead, forever])
    short = {"kind": "k", "n": 200}
    store.put(short, ttl=0.3)
    time.sleep(0.4)  # no Cleaner runs: only the reads' filter hides them
    assert all(store.get(e["id"]) is None for e in [*dead, short])
    assert all(store.get(e["id"]) == e for e in [*live, forever])
    ids = [e["id"] for e in [*live, *dead, short, forever]]
    got = store.get_many(ids)
    assert [g is not None for g in got] == [True] * 10 + [False] * 11 + [True]
    # pages stay full although half the candidates have expired
    page = store.query("by_kind", kind="k", limit=4)
    assert [e["n"] for e in page] == [0, 2, 4, 6]
    assert [e["n"] for e in store.iter("by_kind", kind="k", page_size=3)] == [
        *range(0, 20, 2),
        100,
    ]
    assert [e["n"] for e in store.iter("by_exp", exp__lte=now + 10)] == []
    # another client, which learnt the expiry property from the catalog
    other = same_store(local_cluster, store)
    assert other.cluster.topology.expire_on == "exp"
    assert other.get(dead[0]["id"]) is None and other.get(live[0]["id"]) == live[0]
    other.close()


def test_update_and_create_over_an_expired_entity(make_store: Any) -> None:
    store = _store(make_store)
    entity = {"kind": "k", "n": 1, "exp": time.time() - 1}
    v1 = store.put(entity)
    seen: list[Any] = []

    def fn(current: Any) -> dict[str, Any]:
        seen.append(current)
        return {"kind": "k", "n": 2}

    updated = store.update(entity["id"], fn)
    assert seen == [None] and updated.version > v1
    assert store.get(entity["id"]) == {"id": entity["id"], "kind": "k", "n": 2}
    store.put({"id": entity["id"], "kind": "k", "n": 3, "exp": time.time() - 1})
    v4 = store.put({"id": entity["id"], "kind": "k", "n": 4}, expect_version=0)
    got = store.get(entity["id"])
    assert got is not None and got["n"] == 4 and got.version == v4


def test_bad_ttl_writes_nothing(make_store: Any) -> None:
    store = _store(make_store)
    for ttl in (0, -5, "60", math.nan, True):
        entity: dict[str, Any] = {"kind": "k", "n": 1}
        with pytest.raises(InvalidEntity):
            store.put(entity, ttl=ttl)
        assert "id" not in entity  # refused before an id was even made
    with pytest.raises(InvalidEntity):
        store.put_many([{"kind": "k", "n": 1}, {"kind": "k", "n": 2}], ttl=-1)
    batch: list[dict[str, Any]] = [{"id": new_id(), "n": 1}, {"id": new_id(), "exp": "soon"}]
    with pytest.raises(InvalidEntity, match="epoch seconds"):
        store.put_many(batch)
    assert store.get_many([e["id"] for e in batch]) == [None, None]
    assert store.query("by_kind", kind="k") == []
    plain = make_store()
    with pytest.raises(InvalidEntity, match="expiry property"):
        plain.put({"n": 1}, ttl=60)


def test_the_expiry_property_is_the_catalogs(make_store: Any, local_cluster: LocalCluster) -> None:
    store = _store(make_store)
    with pytest.raises(CatalogError, match="'exp', not 'other'"):
        DataStore(
            local_cluster.addresses,
            option_file=str(local_cluster.option_file),
            prefix=store.cluster.topology.prefix,
            expire_on="other",
        )
    with pytest.raises(InvalidEntity):
        make_store(expire_on="id")
    store.cluster.catalog.set_expire_on(None, replace=True)
    other = same_store(local_cluster, store)
    assert other.cluster.topology.expire_on is None
    other.put({"id": b"\x01" * 16, "exp": "not a time"})  # no expiry: a plain property
    other.close()


def test_the_asyncio_facade_takes_a_ttl(make_store: Any) -> None:
    ads = AsyncDataStore.wrap(_store(make_store), workers=2)

    async def main() -> None:
        one: dict[str, Any] = {"kind": "k", "n": 1}
        await ads.put(one, ttl=3600)
        many: list[dict[str, Any]] = [{"kind": "k", "n": 2}]
        await ads.put_many(many, ttl=3600)
        assert await ads.get_many([one["id"], many[0]["id"]]) == [one, *many]
        with pytest.raises(InvalidEntity):
            await ads.put({"kind": "k", "n": 3}, ttl=-1)

    asyncio.run(main())
    assert time.time() + 3500 < one_exp(ads.sync, "k") < time.time() + 3601


def one_exp(store: DataStore, kind: str) -> float:
    return float(max(e["exp"] for e in store.iter("by_kind", kind=kind)))


# -- the Cleaner --------------------------------------------------------------------------


def _stored(store: DataStore, ids: list[bytes]) -> dict[bytes, bytes | None]:
    """The raw body of each id (None: a tombstone or no row)."""
    found = read_entities(store, store.cluster.refresh(), ids)
    return {key: s.body for key, s in found.items()}


# a partial index on the expiry property holds only some entities: the Cleaner scans
PARTIAL_EXP = Index("by_exp", {"exp": "float"}, where={"kind": "other"})


@pytest.mark.parametrize(
    "indexes",
    [(BY_KIND,), (BY_KIND, BY_EXP), (BY_KIND, PARTIAL_EXP)],
    ids=["scan", "index", "partial"],
)
def test_cleaner_deletes_expired_entities(make_store: Any, indexes: tuple[Index, ...]) -> None:
    store = _store(make_store, indexes)
    now = time.time()
    live = [{"kind": "k", "n": i, "exp": now + 3600} for i in range(30)]
    dead = [{"kind": "k", "n": i, "exp": now - 60 + i} for i in range(30, 60)]
    store.put_many([*live, *dead, {"kind": "k", "n": 99}])
    cleaner = Cleaner(store, batch=7)
    figures = cleaner.run_once()
    assert figures["expired_purged"] == 30 and figures["expired_kept"] == 0
    assert figures["expired_pending"] == 0
    bodies = _stored(store, [e["id"] for e in [*live, *dead]])
    assert [bodies[e["id"]] is None for e in live] == [False] * 30
    assert [bodies[e["id"]] is None for e in dead] == [True] * 30
    assert cleaner.run_once()["expired_purged"] == 30  # nothing more to do
    store.flush()
    assert_clean(store)
    # the Cleaner's clock decides: one hour ahead, the live ones have expired too
    assert cleaner.run_once(now=now + 3601)["expired_purged"] == 60
    assert store.get(live[0]["id"]) is None


def test_scan_slices_resume_across_passes(make_store: Any) -> None:
    store = _store(make_store)
    dead = [{"kind": "k", "n": i, "exp": 1.0} for i in range(40)]
    store.put_many(dead)
    cleaner = Cleaner(store, batch=5, sweep_budget=10)
    passes = 0
    while cleaner.figures.as_dict()["expired_purged"] < 40:
        cleaner.run_once(full=False)
        passes += 1
        assert passes < 40, "the scan does not move on between passes"
    assert passes > 1  # each pass took its slice only
    assert all(b is None for b in _stored(store, [e["id"] for e in dead]).values())


@pytest.mark.parametrize("indexes", [(BY_KIND,), (BY_EXP,)], ids=["scan", "index"])
def test_a_reput_between_the_cleaners_read_and_delete_wins(
    make_store: Any, local_cluster: LocalCluster, indexes: tuple[Index, ...]
) -> None:
    store = _store(make_store, indexes)
    entity = {"kind": "k", "n": 1, "exp": time.time() - 1}
    store.put(entity)
    writer = same_store(local_cluster, store)
    again = {"id": entity["id"], "kind": "k", "n": 2}

    def reput() -> None:
        writer.put(again, ttl=3600)

    failpoints.set("cleaner.expire.before_delete", reput)
    figures = Cleaner(store).run_once()
    assert figures["expired_kept"] == 1 and figures["expired_purged"] == 0
    assert store.get(entity["id"]) == again
    failpoints.clear()
    assert Cleaner(store).run_once()["expired_purged"] == 0  # and not on the next pass
    assert store.get(entity["id"]) == again
    writer.close()


def test_oracle_random_ttls_reputs_and_concurrent_cleaners(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    """Writers re-put, delete and let entities expire while Cleaners run: every
    entity ends as its last write left it (an expired one is gone, a live one intact)."""
    store = _store(make_store, (BY_KIND, BY_EXP))
    rng = random.Random(25)
    ids = [new_id() for _ in range(60)]
    model: dict[bytes, dict[str, Any] | None] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def write(client: DataStore, key: bytes, i: int) -> None:
        roll = rng.random()
        body: dict[str, Any] | None = {"id": key, "kind": "k", "n": i}
        with lock:  # one writer per entity at a time: the model is its last write
            if roll < 0.15:
                client.delete(key)
                body = None
            elif roll < 0.55:
                assert body is not None
                body["exp"] = time.time() - rng.random()  # expired at once
                client.put(body)
            elif roll < 0.8:
                client.put(body, ttl=3600)
            else:
                client.put(body)
            model[key] = body

    def writer() -> None:
        client = same_store(local_cluster, store)
        i = 0
        while not stop.is_set():
            write(client, rng.choice(ids), i)
            i += 1
        client.close()

    def race() -> None:
        """Between the Cleaner's read and its deletes: re-put some expired entities."""
        with lock:
            gone = [k for k, body in model.items() if body is not None and expired(body, "exp")]
        for key in rng.sample(gone, min(len(gone), 3)):
            write(store, key, -1)

    for i, key in enumerate(ids):
        write(store, key, i)
    failpoints.set("cleaner.expire.before_delete", race)
    thread = threading.Thread(target=writer)
    thread.start()
    cleaner = Cleaner(store, batch=9)
    try:
        for _ in range(4):
            cleaner.run_once()
    finally:
        stop.set()
        thread.join()
    failpoints.clear()
    final = cleaner.run_once()
    assert final["expired_purged"] > 0 and final["expired_pending"] == 0
    assert final["expired_kept"] > 0  # the races happened
    bodies = _stored(store, ids)
    now = time.time()
    for key in ids:
        want = model[key]
        alive = want is not None and not expired(want, "exp", now)
        assert store.get(key) == (want if alive else None), key.hex()
        assert (bodies[key] is not None) == alive, key.hex()  # expired: deleted
    store.flush()
    assert_clean(store)


def test_the_cleaner_user_may_expire_once_granted_again(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store = _store(make_store)
    dead = {"kind": "k", "n": 1, "exp": 1.0}
    store.put(dead)
    catalog = store.cluster.catalog
    with new_users(local_cluster, uuid.uuid4().hex[:8], ("cleaner",)) as made:
        user = made["cleaner"]
        catalog.set_expire_on(None, replace=True)  # grants of a datastore without expiry
        apply_grants(store, "cleaner", user.account)
        catalog.set_expire_on("exp", replace=True)
        with open_as(local_cluster, store, user) as ds:
            figures = Cleaner(ds).run_once()
            assert figures["expire_skipped"] == 1 and figures["expired_purged"] == 0
            assert _stored(store, [dead["id"]])[dead["id"]] is not None
            apply_grants(store, "cleaner", user.account)  # now with UPDATE (body)
            assert Cleaner(ds).run_once()["expired_purged"] == 1
    assert _stored(store, [dead["id"]])[dead["id"]] is None
