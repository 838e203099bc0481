"""Counted indexes (``Index(..., counted=True)``) and ``DataStore.count``: the keys
(pure), the counters step 2 keeps against a brute-force count of the datastore's
contents, with concurrent writers, a writer killed between steps, the Cleaner's
repair, a shard move and a backfill (docs/architecture.md, "Counts")."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import same_store
from test_cli import Cli, cluster_env, drop_prefix

from schemaless import Index
from schemaless import dump as dumping
from schemaless.cleaner import Cleaner
from schemaless.cleaner.counted import backfill_counts
from schemaless.counts import count_keys, prefix_key
from schemaless.errors import (
    CatalogError,
    ConflictError,
    IndexDefinitionError,
    IndexNotReady,
    InvalidQuery,
)
from schemaless.grants import grant_statements
from schemaless.local import LocalCluster
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import admin

LIKES = Index("likes", {"entry": "int", "user": "int"}, counted=True)
TAGS = Index("tags", {"tags": "str(20)", "n": "int"}, multi="tags", counted=True)
POSTS = Index("posts", {"user": "int"}, where={"kind": "post"}, counted=True)


# -- keys (no server) ---------------------------------------------------------------------


def test_counted_is_part_of_the_definition() -> None:
    assert LIKES.to_dict()["counted"] is True
    assert Index.from_dict(LIKES.to_dict()) == LIKES
    assert Index("likes", {"entry": "int", "user": "int"}) != LIKES
    assert "counted" not in Index("x", {"a": "int"}).to_dict()  # old catalogs read the same
    with pytest.raises(IndexDefinitionError, match="counted of index 'x' must be True or False"):
        Index("x", {"a": "int"}, counted=1)  # type: ignore[arg-type]


def test_keys_are_one_per_distinct_prefix() -> None:
    keys = count_keys(LIKES, 7, LIKES.rows({"entry": 1, "user": 2}))
    assert keys == {prefix_key(LIKES, 7, p) for p in [(), (1,), (1, 2)]}
    # a multi-valued property: one key per element, the empty prefix once
    rows = TAGS.rows({"tags": ["a", "b", "a"], "n": 3})
    assert count_keys(TAGS, 7, rows) == {
        prefix_key(TAGS, 7, p) for p in [(), ("a",), ("b",), ("a", 3), ("b", 3)]
    }
    # no rows, no keys: outside a partial filter, or a property missing
    assert count_keys(POSTS, 7, POSTS.rows({"user": 1, "kind": "like"})) == set()
    assert count_keys(LIKES, 7, LIKES.rows({"entry": 1})) == set()


def test_keys_tell_apart_indexes_lengths_values_and_declarations() -> None:
    base = prefix_key(LIKES, 7, (1,))
    assert len(base) == 16
    assert prefix_key(LIKES, 8, (1,)) != base  # declared again: other counters
    assert prefix_key(Index("other", {"entry": "int"}), 7, (1,)) != base
    assert prefix_key(LIKES, 7, (2,)) != base
    assert prefix_key(LIKES, 7, ("1",)) != prefix_key(LIKES, 7, (1,))
    assert prefix_key(LIKES, 7, (1, 2)) != prefix_key(LIKES, 7, (12,))


# -- on real servers ----------------------------------------------------------------------


def _everything(store: Any) -> list[Any]:
    """Every live entity (each has ``seq``, so each has a row in ``EVERY``)."""
    return list(store.iter(EVERY))


EVERY = Index("every", {"seq": "int"})


def test_counts_follow_puts_updates_and_deletes(make_store: Any) -> None:
    store = make_store([LIKES, POSTS, EVERY])
    a = {"entry": 1, "user": 10, "kind": "post", "seq": 1}
    store.put(a)
    store.put({"entry": 1, "user": 11, "kind": "like", "seq": 2})
    store.put({"entry": 2, "user": 10, "kind": "post", "seq": 3})
    assert store.count(LIKES, entry=1) == 2
    assert store.count("likes", entry=1, user=10) == 1
    assert store.count(LIKES) == 3
    assert store.count(POSTS) == 2 and store.count(POSTS, user=10) == 2
    store.put({**a, "entry": 2, "kind": "like"})  # a blind overwrite moves it
    assert store.count(LIKES, entry=1) == 1 and store.count(LIKES, entry=2) == 2
    assert store.count(POSTS) == 1  # left the partial filter
    store.delete(a["id"])
    assert store.count(LIKES, entry=2) == 1 and store.count(LIKES) == 2
    assert store.count(LIKES, entry__in=[1, 2, 3]) == 2
    # a compare-and-set that loses (the same expected version) changes no count
    b = store.query(LIKES, entry=1)[0]
    store.put({**b, "entry": 5}, expect_version=b.version)
    with pytest.raises(ConflictError):
        store.put({**b, "entry": 6}, expect_version=b.version)
    with pytest.raises(ConflictError):
        store.put({**b, "entry": 7}, expect_version=0)  # a create over a live entity
    assert [store.count(LIKES, entry=e) for e in (1, 5, 6, 7)] == [0, 1, 0, 0]
    assert store.count(LIKES) == 2


def _counters(store: Any) -> list[Any]:
    topo = store.cluster.refresh()
    db = quote(topo.owned_db, "counts")
    return [
        sorted(server.run(admin([f"SELECT `shard`, `key`, `n` FROM {db}"]))[0])
        for server in store.cluster.all_servers(topo).values()
    ]


def test_bad_counts_are_typed_errors_and_write_nothing(make_store: Any) -> None:
    plain = Index("plain", {"entry": "int", "user": "int"})
    store = make_store([LIKES, TAGS, plain])
    store.put({"entry": 1, "user": 2, "tags": ["a", "b"], "n": 1})
    before = _counters(store)
    bad = [
        (dict(index=plain, entry=1), "index 'plain' is not counted"),
        (dict(index=LIKES, entry=1, user__gt=1), "needs exact=False"),
        (dict(index=LIKES, user=2), "must fix a prefix"),
        (dict(index=LIKES, nope=2), "has no property 'nope'"),
        (dict(index=LIKES, entry="x"), "entry"),
        (dict(index=TAGS, tags__in=["a", "b"]), "multi-valued property 'tags'"),
        (dict(index=LIKES, exact="yes"), "exact must be True or False"),
        (dict(index="missing"), "no index named 'missing'"),
    ]
    for kwargs, needle in bad:
        with pytest.raises(InvalidQuery, match=needle):
            store.count(**kwargs)
    assert _counters(store) == before
    # exact=False takes what a query takes, on any index: the rows (an upper bound)
    assert store.count(plain, exact=False, entry=1, user__gt=1) == 1
    assert store.count(TAGS, exact=False, tags__in=["a", "b"]) == 2  # one entity, two rows
    assert store.count(TAGS, exact=False, tags__startswith="a") == 1


def test_the_databases_layout_is_refused_naming_the_way_over(make_store: Any) -> None:
    store = make_store([Index("plain", {"entry": "int"})], layout="databases")
    with pytest.raises(CatalogError, match=r"owned layout.*schemaless dump"):
        store.declare_index(LIKES)
    with pytest.raises(CatalogError, match="owned layout"):
        store.count("plain", exact=False, entry=1)
    assert "likes" not in store.cluster.refresh().indexes


def test_the_cli_declares_counted_indexes_and_counts(local_cluster: LocalCluster) -> None:
    prefix = "cnt_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        run.ok("init", "--shards", "4")
        made = run.ok("index", "create", "likes", "--property", "entry:int",
                      "--property", "user:int", "--counted")  # fmt: skip
        assert "counted" in made.output.splitlines()[0]
        assert "entry:int, user:int, counted" in run.ok("index", "list").output
        run.ok("index", "create", "plain", "--property", "entry:int")
        lines = "".join(json.dumps({"entry": e, "user": u}) + "\n" for e, u in [(1, 1), (1, 2)])
        run.ok("put", input=lines)
        assert run.ok("count", "likes", "--where", "entry=1").output == "2\n"
        assert run.ok("count", "likes").output == "2\n"
        shown = json.loads(
            run.ok(
                "count", "likes", "--where", "entry=1", "--where", "user>1", "--no-exact", "--json"
            ).output
        )
        assert shown == {"index": "likes", "count": 1, "exact": False}
        assert "not counted" in run.fails("count", "plain", "--where", "entry=1")
        assert "needs exact=False" in run.fails("count", "likes", "--where", "entry>0")
        assert "no index named 'nope'" in run.fails("count", "nope")
    finally:
        drop_prefix(local_cluster, prefix)


# -- the oracle: counts against a brute-force count of the datastore's contents ----------

GROUPS = Index("groups", {"g": "int", "tags": "str(8)"}, multi="tags", where={"kind": "a"},
               counted=True)  # fmt: skip
PAIRS = Index("pairs", {"h": "int", "g": "int"}, counted=True)
ORACLE = [GROUPS, PAIRS, EVERY]


def _body(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"seq": 0, "kind": rng.choice("ab"), "g": rng.randrange(3)}
    if rng.random() < 0.9:
        body["h"] = rng.randrange(3)
    body["tags"] = rng.sample(["x", "y", "z"], rng.randrange(4))
    return body


def _expected(store: Any) -> dict[tuple[str, tuple[Any, ...]], int]:
    """Each counted index's prefixes and how many live entities have one, by brute force."""
    want: dict[tuple[str, tuple[Any, ...]], int] = {}
    for entity in _everything(store):
        for index in (GROUPS, PAIRS):
            rows = index.rows(entity)
            for p in {row[:j] for row in rows for j in range(len(row) + 1)}:
                want[index.name, p] = want.get((index.name, p), 0) + 1
    return want


def _assert_counts(store: Any) -> None:
    store.flush()
    want = _expected(store)
    assert want[("groups", ())] > 0 and want[("pairs", ())] > 0  # something to count
    for name, prefix in [*want, ("pairs", (9,)), ("groups", (1, "w"))]:
        index = GROUPS if name == "groups" else PAIRS
        where = dict(zip(index.properties, prefix, strict=False))
        got = store.count(name, where=where)
        assert got == want.get((name, prefix), 0), (name, prefix)
        assert store.count(name, exact=False, where=where) >= got  # the rows: an upper bound


def _operate(store: Any, rng: random.Random, ids: list[bytes], ops: int) -> None:
    for _ in range(ops):
        key = rng.choice(ids)
        roll = rng.random()
        try:
            if roll < 0.35:
                store.put({"id": key, **_body(rng)})
            elif roll < 0.6:
                current = store.get(key)
                if current is not None:
                    store.put({**current, **_body(rng)}, expect_version=current.version)
            elif roll < 0.75:
                store.delete(key)
            elif roll < 0.85:
                store.put({"id": key, **_body(rng)}, expect_version=0)
            else:
                store.put_many({"id": k, **_body(rng)} for k in rng.sample(ids, 3))
        except ConflictError:
            pass


def test_counts_match_a_brute_force_count_under_concurrent_writers(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store = make_store(ORACLE)
    store.put({"seq": 0, "kind": "a", "g": 1, "h": 1, "tags": ["x"]})  # never touched below
    ids = [uuid.uuid4().bytes for _ in range(10)]
    clients = [same_store(local_cluster, store) for _ in range(3)]
    failed: list[BaseException] = []

    def operate(client: Any, seed: int) -> None:
        try:
            _operate(client, random.Random(seed), ids, 50)
        except BaseException as exc:  # a writer's error fails the test, not its thread
            failed.append(exc)

    try:
        threads = [threading.Thread(target=operate, args=(c, i)) for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clients:
            c.close()
    assert not failed, failed
    _assert_counts(store)
    _operate(store, random.Random(9), ids, 40)  # and alone, partial-filter moves included
    _assert_counts(store)


_WRITER = """
import json, sys
from schemaless import DataStore
servers, prefix, option_file, op, key, body = sys.argv[1:]
ds = DataStore(servers.split(","), prefix=prefix, option_file=option_file)
if op == "put":
    ds.put({"id": bytes.fromhex(key), **json.loads(body)})
else:
    ds.delete(bytes.fromhex(key))
"""


def _killed(local_cluster: LocalCluster, store: Any, point: str, op: str, key: bytes) -> None:
    """A writer process SIGKILLed at failpoint ``point`` of its ``op`` of ``key``."""
    body = json.dumps({"seq": 0, "kind": "a", "g": 2, "h": 1, "tags": ["z"]})
    args = [",".join(str(a) for a in local_cluster.addresses), store.cluster.topology.prefix]
    args += [str(local_cluster.option_file), op, key.hex(), body]
    env = {**os.environ, "SCHEMALESS_FAILPOINTS": f"{point}=kill"}
    done = subprocess.run([sys.executable, "-c", _WRITER, *args], env=env, timeout=60)
    assert done.returncode == -signal.SIGKILL


def test_a_writer_killed_between_steps_and_the_cleaners_repair_leave_counts_exact(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store = make_store(ORACLE)
    ids = [uuid.uuid4().bytes for _ in range(8)]
    _operate(store, random.Random(5), ids, 30)
    for n, point in enumerate(["put.after_index_rows", "put.after_entity"]):
        _killed(local_cluster, store, point, "put", ids[n])
    _killed(local_cluster, store, "delete.after_entity", "delete", ids[2])
    _killed(local_cluster, store, "put.after_index_rows", "put", uuid.uuid4().bytes)  # orphans
    _assert_counts(store)
    before = _counters(store)
    Cleaner(store).run_once()  # repairs orphan and stale index rows: no count changes
    assert _counters(store) == before
    _assert_counts(store)


def test_counts_move_with_their_shard(make_store: Any) -> None:
    store = make_store(ORACLE, shards=4)
    ids = [uuid.uuid4().bytes for _ in range(12)]
    _operate(store, random.Random(6), ids, 40)
    before = _expected(store)
    topo = store.cluster.topology
    shard = max(range(4), key=lambda s: sum(store.cluster.shard_of_id(k) == s for k in ids))
    there = next(sid for sid in topo.servers if sid != topo.shard_servers[shard])
    ShardMover(store).move(shard, there)
    ShardMover(store).drop_old_copies()
    store.cluster.refresh()
    assert _expected(store) == before
    _assert_counts(store)
    _operate(store, random.Random(7), ids, 30)  # writes on the shard's new server
    _assert_counts(store)


def test_counts_of_an_index_declared_on_existing_data_are_backfilled_with_a_writer_running(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store = make_store([EVERY])
    ids = [uuid.uuid4().bytes for _ in range(30)]
    store.put_many({"id": k, **_body(random.Random(i))} for i, k in enumerate(ids))
    assert store.declare_index(GROUPS) == "building"
    assert store.declare_index(PAIRS) == "building"
    with pytest.raises(IndexNotReady):
        store.count(GROUPS)
    writer = same_store(local_cluster, store)
    stop = threading.Event()

    def write() -> None:
        rng = random.Random(11)
        while not stop.is_set():
            _operate(writer, rng, ids[:10], 1)  # the other 20: only the backfill counts them

    thread = threading.Thread(target=write)
    thread.start()
    try:
        assert Cleaner(store).backfill("groups") == "ready"
        assert Cleaner(store).backfill("pairs") == "ready"
    finally:
        stop.set()
        thread.join()
        writer.close()
    store.cluster.refresh()
    _assert_counts(store)
    before = _counters(store)
    assert backfill_counts(store, GROUPS) > 0  # run again: nothing counted twice
    assert _counters(store) == before


def test_the_cleaner_user_may_write_the_counts_of_a_counted_index(make_store: Any) -> None:
    store = make_store([LIKES])
    stmts = grant_statements(store, "cleaner", "'c'@'%'")
    for table in ("counts", "counted_keys"):
        assert sum(f".`{table}`" in s and "INSERT, UPDATE, DELETE" in s for s in stmts) == 2
    plain = make_store([Index("plain", {"a": "int"})])
    assert not any("`counts`" in s for s in grant_statements(plain, "cleaner", "'c'@'%'"))


def test_a_restore_counts_through_the_cleaners_backfill(make_store: Any, tmp_path: Path) -> None:
    src = make_store(ORACLE)
    _operate(src, random.Random(8), [uuid.uuid4().bytes for _ in range(12)], 30)
    dumping.dump(src, tmp_path / "d")
    target = make_store(shards=3)
    for name in dumping.restore(target, tmp_path / "d"):
        assert Cleaner(target).backfill(name) == "ready"
    target.cluster.refresh()
    assert _expected(target) == _expected(src)
    _assert_counts(target)


def test_the_cleaners_expiry_uncounts_what_expired(make_store: Any) -> None:
    store = make_store([LIKES], expire_on="exp")
    now = time.time()
    store.put_many([{"entry": 1, "user": u, "exp": now + 3600 * (u % 2) - 60} for u in range(10)])
    assert store.count(LIKES, entry=1) == 10  # the counters know nothing of expiry
    assert Cleaner(store).run_once()["expired_purged"] == 5
    assert store.count(LIKES, entry=1) == 5 and store.count(LIKES) == 5
