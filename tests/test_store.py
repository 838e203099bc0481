"""The datastore core against the real local cluster: round trips, batches, conflicts."""

from __future__ import annotations

import os
import re
import threading
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import drop_datastore, same_store
from faults.helpers import count_rows, open_store, scratch_cluster

from schemaless import (
    CatalogError,
    ConflictError,
    DataStore,
    EntityTooLarge,
    Index,
    InvalidEntity,
    InvalidId,
    new_id,
)
from schemaless.catalog import now_us
from schemaless.cluster import SAFE_PACKET
from schemaless.local import LocalCluster
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import admin, placement
from schemaless.scatter import dbs_by_server


def test_friendfeed_post_example(make_store: Any) -> None:
    """The API of the 2009 post, as it was written there."""
    user_id_index = Index(table="index_user_id", properties=["user_id"], shard_on="user_id")
    store = make_store(indexes=[user_id_index])
    entity = {
        "id": bytes.fromhex("71f0c4d2291844cca2df6f486e96e37c"),
        "user_id": bytes.fromhex("f48b0440ca0c4f66991c4d5f6a078eaf"),
        "feed_id": bytes.fromhex("f48b0440ca0c4f66991c4d5f6a078eaf"),
        "title": "We just launched a new backend system for FriendFeed!",
        "link": "http://friendfeed.com/e/71f0c4d2-2918-44cc-a2df-6f486e96e37c",
        "published": 1235697046,
        "updated": 1235697046,
    }
    store.put(entity)
    assert store.get(entity["id"]) == entity
    found = user_id_index.get_all(store, user_id=entity["user_id"])
    assert found == [entity]
    # The post's second index, on a long URL, added later.
    link_index = Index(table="index_link", properties=["link"], shard_on="link")
    assert store.declare_index(link_index) == "building"
    assert store.indexes()["link"].state == "building"


def test_mysql_shards_constructor_initialises_a_new_datastore(local_cluster: Any) -> None:
    prefix = "t_" + uuid.uuid4().hex[:10]
    store = DataStore(
        mysql_shards=local_cluster.addresses,
        option_file=str(local_cluster.option_file),
        prefix=prefix,
    )
    try:
        topo = store.cluster.topology
        assert topo.n_shards == 64  # the documented default
        assert sorted(set(topo.shard_servers)) == [0, 1]
        again = DataStore(
            mysql_shards=local_cluster.addresses[:1],
            option_file=str(local_cluster.option_file),
            prefix=prefix,
        )
        assert again.cluster.topology.shard_servers == topo.shard_servers  # init idempotent
        again.close()
    finally:
        drop_datastore(store)


def test_clients_that_create_one_datastore_at_once_agree_on_its_map(local_cluster: Any) -> None:
    """Six clients open a new datastore at the same moment, half asking for 8 logical
    shards and half for 16: one map is written, whole; the clients that asked for the
    other count are refused (the loser's shard rows used to go into the winner's map,
    and every later open failed with "catalog maps 16 of 8 shards")."""
    prefix = "t_" + uuid.uuid4().hex[:10]
    start = threading.Barrier(6)
    opened: list[DataStore] = []
    refused: list[CatalogError] = []

    def open_it(shards: int) -> None:
        start.wait()
        try:
            opened.append(
                DataStore(
                    local_cluster.addresses,
                    option_file=str(local_cluster.option_file),
                    prefix=prefix,
                    shards=shards,
                )
            )
        except CatalogError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=open_it, args=(8 << (i % 2),)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert opened and len(opened) + len(refused) == 6
        n = opened[0].cluster.topology.n_shards
        assert all(s.cluster.topology.n_shards == n for s in opened)
        assert all(f"has {n} logical shards" in str(e) for e in refused), refused
        again = same_store(local_cluster, opened[0])
        assert again.cluster.topology.shard_servers == tuple(placement(n, 2, "owned"))
        again.close()
    finally:
        for store in opened[1:]:
            store.close()
        if opened:
            servers = opened[0].cluster.all_servers(opened[0].cluster.topology).values()
            for server in servers:  # with the shard databases of the clients that lost
                for (db,) in server.run(
                    "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
                    (prefix + "\\_%",),
                )[0]:
                    server.run(admin([f"DROP DATABASE {quote(str(db))}"]))
            opened[0].close()


SAMPLES: list[Any] = [
    None,
    True,
    False,
    0,
    -(2**63),
    2**64 - 1,
    1.5,
    float("inf"),
    "",
    "héllo wörld ✓ 𝄞",
    b"",
    b"\x00\xff" * 10,
    [],
    [1, "two", [3.0, None]],
    {},
    {"nested": {"deeper": [{"x": 1}]}},
    uuid.uuid4(),
    datetime(2009, 2, 26, 12, 0, tzinfo=UTC),
    datetime(2026, 11, 21, 18, 0, 1, 123456, tzinfo=timezone(timedelta(hours=-5))),
]


@pytest.mark.parametrize("value", SAMPLES, ids=lambda v: type(v).__name__)
def test_every_supported_type_round_trips(make_store: Any, value: Any) -> None:
    store = make_store()
    entity = {"id": new_id(), "value": value}
    version = store.put(entity)
    got = store.get(entity["id"])
    assert got == entity
    assert got is not None and got.version == version
    assert type(got["value"]) is type(value)


def test_batches_span_both_servers(make_store: Any) -> None:
    calls: list[str] = []
    store = make_store(tracer=lambda server, sql, t: calls.append(server))
    entities = [{"id": new_id(), "n": i} for i in range(200)]
    calls.clear()
    versions = store.put_many(entities)
    assert len(versions) == 200 and all(v > 0 for v in versions)
    assert sorted(calls) == sorted(set(calls)) and len(set(calls)) == 2  # one batch per server
    ids = [e["id"] for e in entities] + [new_id()]
    calls.clear()
    got = store.get_many(ids)
    assert len(calls) == 2
    assert got[:-1] == entities and got[-1] is None
    assert [g.version for g in got[:-1] if g is not None] == versions
    per_server = {sid: 0 for sid in store.cluster.topology.servers}
    for e in entities:
        per_server[store.cluster.topology.shard_servers[store.cluster.shard_of_id(e["id"])]] += 1
    assert all(n > 50 for n in per_server.values())
    assert store.delete_many(ids) == 200
    assert store.get_many(ids) == [None] * 201
    assert store.delete_many(ids) == 0


def test_entity_without_id_gets_a_time_ordered_one(make_store: Any) -> None:
    store = make_store()
    entity: dict[str, Any] = {"title": "no id"}
    store.put(entity)
    assert isinstance(entity["id"], bytes) and len(entity["id"]) == 16
    assert entity["id"][6] >> 4 == 7  # UUIDv7
    assert store.get(entity["id"]) == entity


@pytest.mark.parametrize("indexed", [False, True])
def test_a_made_id_that_is_taken_never_overwrites(
    make_store: Any, monkeypatch: pytest.MonkeyPatch, indexed: bool
) -> None:
    """A store-made id is written with a plain INSERT: were it ever taken, the write
    fails as a conflict and leaves the stored entity (and its index rows) alone."""
    indexes = [Index("by_n", {"n": "int"}, shard_on="n")] if indexed else []
    store = make_store(indexes=indexes)
    key = new_id()
    version = store.put({"id": key, "n": 1})
    before = count_rows(store)
    monkeypatch.setattr("schemaless.protocol.new_id", lambda: key)
    with pytest.raises(ConflictError, match="uplicate"):
        store.put({"n": 2})
    got = store.get(key)
    assert got == {"id": key, "n": 1} and got is not None and got.version == version
    assert count_rows(store)["entities"] == before["entities"]
    if indexed:  # a row the refused write put on another server first is filtered out
        assert store.query("by_n", n=2) == []
        assert [e["id"] for e in store.query("by_n", n=1)] == [key]


def test_uuid_and_bytes_ids_are_the_same_entity(make_store: Any) -> None:
    store = make_store()
    key = uuid.uuid4()
    store.put({"id": key, "x": 1})
    got = store.get(key.bytes)
    assert got is not None and got["id"] == key


def test_compare_and_set(make_store: Any) -> None:
    store = make_store()
    key = new_id()
    v1 = store.put({"id": key, "n": 1}, expect_version=0)
    with pytest.raises(ConflictError) as info:
        store.put({"id": key, "n": 99}, expect_version=0)
    assert info.value.current_version == v1
    v2 = store.put({"id": key, "n": 2}, expect_version=v1)
    assert v2 > v1
    with pytest.raises(ConflictError):
        store.put({"id": key, "n": 3}, expect_version=v1)
    with pytest.raises(ConflictError):
        store.delete(key, expect_version=v1)
    got = store.get(key)
    assert got == {"id": key, "n": 2} and got.version == v2
    assert store.delete(key, expect_version=v2)
    with pytest.raises(ConflictError):
        store.put({"id": key, "n": 4}, expect_version=v2)  # deleted since
    v3 = store.put({"id": key, "n": 5}, expect_version=0)  # create over the tombstone
    assert v3 > v2
    assert store.get(key) == {"id": key, "n": 5}


def test_blind_put_after_delete_gets_a_higher_version(make_store: Any) -> None:
    store = make_store()
    key = new_id()
    store.put({"id": key, "n": 1})
    store.delete(key)
    future = store.clock.next() + 10**9  # another client's clock far ahead
    store.clock._last = 0  # this client's clock far behind
    topo, shard = store.cluster.topology, store.cluster.shard_of_id(key)
    store.cluster.server_of_shard(topo, shard).run(
        admin([f"UPDATE {quote(topo.dbs[shard], 'entities')} SET version = %s WHERE id = %s"]),
        (future, key),
    )
    version = store.put({"id": key, "n": 2})
    assert version > future
    assert store.get(key) == {"id": key, "n": 2}


def test_concurrent_updates_lose_nothing(make_store: Any) -> None:
    store = make_store()
    key = new_id()
    store.put({"id": key, "likes": 0})
    done = []
    lock = threading.Lock()

    def like() -> None:
        for _ in range(15):
            store.update(
                key, lambda e: {**(e or {}), "likes": (e or {"likes": 0})["likes"] + 1}, retries=100
            )
            with lock:
                done.append(1)

    threads = [threading.Thread(target=like) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = store.get(key)
    assert got is not None and got["likes"] == len(done) == 90


def test_update_raises_conflict_after_retries(make_store: Any) -> None:
    store = make_store()
    key = new_id()
    store.put({"id": key, "n": 0})
    calls = []

    def meddle(entity: Any) -> dict[str, Any]:
        calls.append(1)
        store.put({"id": key, "n": len(calls) * 100})  # someone else writes each time
        return {**entity, "n": -1}

    with pytest.raises(ConflictError):
        store.update(key, meddle, retries=3)
    assert len(calls) == 3
    got = store.get(key)
    assert got is not None and got["n"] == 300


def test_update_refuses_a_function_that_returns_no_entity(make_store: Any) -> None:
    """A function that changed the entity in place and returned None raised
    ``TypeError: 'NoneType' object is not iterable``; a list, a bare ValueError."""
    store = make_store()
    key = new_id()
    store.put({"id": key, "n": 0})

    def bump_in_place(entity: Any) -> Any:
        entity["n"] += 1

    with pytest.raises(InvalidEntity, match=r"got NoneType \(did it change the entity in place"):
        store.update(key, bump_in_place)
    with pytest.raises(InvalidEntity, match="return the new entity, a dict; got list"):
        store.update(key, lambda entity: [("n", 1)])
    with pytest.raises(InvalidEntity, match="must not change the entity's id"):
        store.update(key, lambda entity: {"id": new_id()})
    got = store.get(key)
    assert got is not None and got["n"] == 0  # nothing written


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_ENTITIES: list[tuple[Any, type[Exception]]] = [
    ({"id": b"short", "x": 1}, InvalidId),
    ({"id": "not-bytes" * 2, "x": 1}, InvalidId),
    ({"x": object()}, InvalidEntity),
    ({"x": 2**64}, InvalidEntity),
    ({"x": -(2**63) - 1}, InvalidEntity),
    ({1: "int key"}, InvalidEntity),
    ({"x": (1, 2)}, InvalidEntity),
    ({"x": {1, 2}}, InvalidEntity),
    ({"x": float("nan")}, InvalidEntity),
    ({"x": "\ud800"}, InvalidEntity),
    ({"x": datetime(2020, 1, 1)}, InvalidEntity),
    ({"x": bytearray(b"ab")}, InvalidEntity),
    ({"deep": _nested(40)}, InvalidEntity),
]


@pytest.mark.parametrize(
    ("entity", "error"), BAD_ENTITIES, ids=lambda x: re.sub(r" at 0x[0-9a-f]+", "", repr(x))[:30]
)
def test_bad_input_is_refused_and_nothing_is_written(
    make_store: Any, entity: dict[str, Any], error: type[Exception]
) -> None:
    store = make_store(indexes=[Index("by_x", ["x:int"])])
    good = {"id": new_id(), "x": 1}
    before = count_rows(store)
    with pytest.raises(error) as info:
        store.put_many([good, dict(entity)])
    assert str(info.value)
    assert count_rows(store) == before
    store.put(good)  # the connection and the store are still usable
    assert store.get(good["id"]) == good


def test_body_above_the_limit_is_refused(make_store: Any) -> None:
    store = make_store(max_body_bytes=10_000)
    import os

    with pytest.raises(EntityTooLarge) as info:
        store.put({"id": new_id(), "blob": os.urandom(20_000)})
    assert "10000" in str(info.value) or "10,000" in str(info.value)
    assert count_rows(store)["entities"] == 0


def test_body_limit_follows_max_allowed_packet(make_store: Any) -> None:
    store = make_store(max_body_bytes=1 << 40)
    packet = int(store.cluster.catalog.server.run("SELECT @@max_allowed_packet")[0][0][0])
    assert store.codec.max_body_bytes < packet


def test_packets_are_read_on_each_servers_first_connection(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    """Opening talks to the catalog's server alone; until another server is connected
    to, a batch assumes SAFE_PACKET of it, then its own max_allowed_packet."""
    store = same_store(local_cluster, make_store())
    try:
        servers = list(store.cluster.all_servers(store.cluster.topology).values())
        assert len(servers) > 1
        catalog = store.cluster.catalog.server
        assert catalog.max_packet is not None
        assert [s.max_packet for s in servers if s.name != catalog.name] == [None] * (
            len(servers) - 1
        )
        assert store.cluster.max_batch_bytes <= SAFE_PACKET - 64 * 1024
        assert store.codec.max_body_bytes <= catalog.max_packet - 64 * 1024
        # a body within the default limit but above a batch for an unknown server: alone
        big = [{"id": new_id(), "blob": os.urandom(4_150_000)}, {"id": new_id(), "n": 1}]
        store.put_many(big)
        store.get_many([new_id() for _ in range(64)])  # every server, surely
        assert store.get_many([e["id"] for e in big]) == big
        packets = [s.max_packet for s in servers]
        assert None not in packets
        assert store.cluster.max_batch_bytes == min(p or 0 for p in packets) - 64 * 1024
    finally:
        store.close()


def test_trained_dictionary_shrinks_bodies_and_old_bodies_stay_readable(make_store: Any) -> None:
    store = make_store()
    words = "friendfeed schemaless mysql entries comments likes photos links".split()
    old = [
        {"id": new_id(), "title": " ".join(words[i % 7 :] + words[: i % 7]), "n": i}
        for i in range(400)
    ]
    store.put_many(old)
    plain = store.codec.encode(old[0])
    dict_id = store.train_dictionary(samples=400)
    assert store.cluster.topology.active_dictionary == dict_id
    assert store.codec.dictionary_id(store.codec.encode(old[0])) == dict_id
    assert len(store.codec.encode(old[0])) < len(plain)
    new = {"id": new_id(), "title": " ".join(words), "n": -1}
    store.put(new)
    fresh = DataStore(  # a new client: learns the dictionary from the catalog
        str(store.cluster.topology.servers[0]),
        option_file=store.cluster.options.credentials.option_file,
        prefix=store.cluster.topology.prefix,
        create=False,
    )
    try:
        assert fresh.get_many([old[0]["id"], new["id"]]) == [old[0], new]
    finally:
        fresh.close()


def test_a_catalog_from_before_fences_is_upgraded_by_an_open_with_ddl(
    make_store: Any, local_cluster: Any
) -> None:
    """A datastore made before index epochs: its clients write without a fence and may
    not declare an index until a client that may create tables opens it, which gives
    every shard its first fence and the catalog its first epoch."""
    store = make_store()
    topo = store.cluster.refresh()
    catalog = store.cluster.catalog
    catalog.server.run(f"DELETE FROM {quote(catalog.db, 'meta')} WHERE name = 'index_epoch'")
    for sid, server in store.cluster.all_servers(topo).items():
        drops = [quote(db, "fence_1") for db in dbs_by_server(topo)[sid]]
        server.run(admin([f"DROP TABLE {', '.join(drops)}"]))

    with same_store(local_cluster, store) as old:
        assert old.cluster.topology.index_epoch == 0 and old.cluster.topology.fence is None
        entity = {"n": 1}
        old.put(entity)  # no fence named
        assert old.get(entity["id"]) == entity
        with pytest.raises(CatalogError, match="predates index fences"):
            old.declare_index(Index("by_n", {"n": "int"}))
    with same_store(local_cluster, store, create=True) as upgraded:
        now = upgraded.cluster.topology
        assert now.index_epoch == 1
        fences = upgraded.cluster.fences(now)
        every = sorted(db for dbs in dbs_by_server(now).values() for db in dbs)
        assert sorted(db for dbs in fences.values() for db, e in dbs if e == 1) == every
        assert upgraded.declare_index(Index("by_n", {"n": "int"})) == "building"
        upgraded.put({"n": 2})
    assert store.cluster.refresh().index_epoch == 2


def test_batches_above_max_allowed_packet_are_sent_in_parts() -> None:
    """put_many, get_many, delete_many and a shard move's copy of more than one
    statement can carry: the servers' max_allowed_packet (1 MiB on a cluster of its
    own, not a global the other tests' connections would get) used to refuse the
    statement and drop the connection (OutcomeUnknown for a write not applied)."""
    config = {"max_allowed_packet": "1048576"}
    with (
        scratch_cluster("packet", servers=2, durable=False, extra_config=config) as cluster,
        open_store(cluster) as store,
    ):
        assert store.cluster.max_batch_bytes < 1048576
        entities = [{"id": new_id(), "blob": os.urandom(40_000), "n": i} for i in range(100)]
        store.put_many(entities)  # 4 MB of bodies: over 2 MiB a server
        assert store.get_many(e["id"] for e in entities) == entities
        shard = store.cluster.shard_of_id(entities[0]["id"])
        more: list[dict[str, Any]] = []
        while len(more) < 40:  # 1.6 MB more on that shard
            key = new_id()
            if store.cluster.shard_of_id(key) == shard:
                more.append({"id": key, "blob": os.urandom(40_000), "n": -1})
        store.put_many(more)
        ShardMover(store).move(shard, 1 - store.cluster.current().shard_servers[shard])
        assert store.get_many(e["id"] for e in [*entities, *more]) == [*entities, *more]
        absent = [new_id() for _ in range(60_000)]  # 2.2 MB of ids
        assert store.get_many([*absent, entities[0]["id"]])[-1] == entities[0]
        assert store.delete_many([*absent, *(e["id"] for e in entities)]) == 100
        assert store.delete_many(e["id"] for e in more) == 40
        assert store.get_many(e["id"] for e in entities) == [None] * 100


def test_catalog_locks_exclude_each_other_whatever_the_length_of_their_name(
    make_store: Any,
) -> None:
    """Named locks on the catalog server: one holder at a time per name, names longer
    than the server's 64 characters included (hashed), and free again once released."""
    catalog = make_store().cluster.catalog
    for name in ("short", "backfill:" + "x" * 80):
        with catalog.lock(name, "held", wait=0):
            with pytest.raises(CatalogError, match="held"), catalog.lock(name, "held", wait=0):
                pass
            with catalog.lock(name + "-other", "held", wait=0):
                pass
        with catalog.lock(name, "held", wait=0):
            pass


def test_heartbeats_of_daemons_silent_for_a_week_are_forgotten(make_store: Any) -> None:
    """Every ``cleaner --once`` run from cron reports under a new name (its pid): the
    status table used to keep them all, and every status command read them all."""
    catalog = make_store().cluster.catalog
    day = 24 * 3600 * 10**6
    for name, age in (("cleaner:old:1", 8 * day), ("cleaner:recent:2", 6 * day)):
        catalog.server.run(
            f"INSERT INTO {quote(catalog.db, 'status')} (name, heartbeat, figures)"
            " VALUES (%s, %s, '{}')",
            (name, now_us() - age),
        )
    catalog.heartbeat("cleaner:now:3", {"state": "idle"})
    assert sorted(catalog.statuses()) == ["cleaner:now:3", "cleaner:recent:2"]
