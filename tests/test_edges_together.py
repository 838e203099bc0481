"""Both sides of ``Edges.add`` / ``remove`` in one batch when ``src``'s and ``dst``'s
shards share a server (schemaless.edges ``_both``), on real servers: one round trip
in the sides' order, a batch cut after its first side left as a cut between two
round trips leaves it (``repair`` or a retry finishes it), counts exact under
concurrency, and a shard moved between calls (a stale map's batch follows the map)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from conftest import same_store

from schemaless import DataStore, Edges, TableMissing, new_id
from schemaless.local import LocalCluster
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import TRIGGERED, UNCHECKED, admin


@pytest.fixture
def ds(make_store: Callable[..., DataStore]) -> DataStore:
    return make_store()


def node_near(ds: DataStore, node: bytes, *, together: bool) -> bytes:
    """A new id on another shard than ``node``'s, on the same server (``together``)
    or on another one."""
    topo = ds.cluster.current()
    home = ds.cluster.shard_of_id(node)
    while True:
        other = new_id()
        mine = ds.cluster.shard_of_id(other)
        same = topo.shard_servers[mine] == topo.shard_servers[home]
        if mine != home and same == together:
            return other


def traced(ds: DataStore) -> list[str]:
    """The edge batches each server is sent from now on, in order."""
    sent: list[str] = []
    for server in ds.cluster.servers():
        server.tracer = lambda name, sql, s: sent.append(sql) if "edges__" in sql else None
    return sent


@contextmanager
def fenced(ds: DataStore, node: bytes) -> Iterator[None]:
    """``node``'s shard fenced on its server (its ``owned`` row gone, as a move's
    fence leaves it) for the block."""
    topo = ds.cluster.current()
    shard = ds.cluster.shard_of_id(node)
    server = ds.cluster.server_of_shard(topo, shard)
    owned = quote(str(topo.owned_db), "owned")
    server.run(admin([f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {shard}"]))
    try:
        yield
    finally:
        server.run(admin([f"INSERT INTO {owned} (`shard`) VALUES ({shard})"]))


def test_sides_on_one_server_go_in_one_batch_in_order(ds: DataStore) -> None:
    likes = Edges(ds, "likes", inverse="liked_by")
    user = new_id()
    near, far = node_near(ds, user, together=True), node_near(ds, user, together=False)
    sent = traced(ds)
    assert likes.add(user, near) is True
    assert len(sent) == 1  # the inverse's upsert, then the edge's: two statements
    first, last = sent[0].split(";\n")
    assert first.startswith(f"{TRIGGERED} INSERT INTO") and "edges__liked_by" in first
    assert last.startswith(f"{TRIGGERED} INSERT INTO") and "edges__likes`" in last
    assert likes.add(user, near) is False and likes.add(user, near, data=1) is False
    sent.clear()
    assert likes.add(user, far) is True
    assert len(sent) == 2 and "edges__liked_by" in sent[0] and "edges__likes`" in sent[1]
    assert (likes.count(user), likes.count_inverse(near), likes.count_inverse(far)) == (2, 1, 1)
    sent.clear()
    assert likes.remove(user, near) is True
    assert len(sent) == 1  # one transaction: the edge's delete and count, then the inverse's
    statements = sent[0].split(";\n")
    assert statements[0] == f"{TRIGGERED} START TRANSACTION" and statements[-1] == "COMMIT"
    assert [s.startswith("DELETE") for s in statements[1:5]] == [True, False, True, False]
    assert "edges__likes`" in statements[1] and "edges__liked_by" in statements[3]
    assert likes.remove(user, near) is False
    sent.clear()
    assert likes.remove(user, far) is True and len(sent) == 2
    assert likes.remove(user, far) is False
    assert (likes.count(user), likes.count_inverse(near), likes.count_inverse(far)) == (0, 0, 0)
    assert not likes.has(user, near) and likes.page_inverse(near) == []


def test_a_batch_cut_after_its_first_side_leaves_the_inverse_that_repair_or_a_retry_finishes(
    ds: DataStore,
) -> None:
    """The forward shard fenced: the batch's first side (the inverse) commits, its
    second fails, exactly as a cut between two round trips leaves an ``add``."""
    likes = Edges(ds, "likes", inverse="liked_by")
    a = new_id()
    entry = node_near(ds, a, together=True)
    sent = traced(ds)
    with fenced(ds, a), pytest.raises(TableMissing):
        likes.add(a, entry)
    assert len(sent) == 1 and "edges__likes`" in sent[0].split(";\n")[1]
    assert [e.src for e in likes.page_inverse(entry)] == [a] and likes.count_inverse(entry) == 1
    assert not likes.has(a, entry) and likes.count(a) == 0
    assert likes.repair() == 0  # within the grace: may be an add in flight
    assert likes.add(a, entry) is True  # a retry finishes it: counted once
    assert (likes.count(a), likes.count_inverse(entry)) == (1, 1)
    assert likes.add(a, entry) is False and likes.repair(grace=0) == 0
    # the same cut, cleared by repair
    late = node_near(ds, a, together=True)
    with fenced(ds, a), pytest.raises(TableMissing):
        likes.add(a, late)
    assert likes.count_inverse(late) == 1 and likes.repair(grace=0) == 1
    assert (likes.count(a), likes.count_inverse(late), likes.page_inverse(late)) == (1, 0, [])
    assert likes.count_inverse(entry) == 1


def test_a_remove_batch_cut_commits_neither_side(ds: DataStore) -> None:
    """``remove``'s batch is one transaction: with the inverse's shard fenced, the
    forward's delete is rolled back with it, and the retry removes both."""
    likes = Edges(ds, "likes", inverse="liked_by")
    user = new_id()
    entry = node_near(ds, user, together=True)
    likes.add(user, entry)
    with fenced(ds, entry):
        with pytest.raises(TableMissing):
            likes.remove(user, entry)
        assert likes.has(user, entry) and likes.count(user) == 1
    assert likes.count_inverse(entry) == 1
    with fenced(ds, user), pytest.raises(TableMissing):  # the forward's shard: nothing either
        likes.remove(user, entry)
    assert (likes.count(user), likes.count_inverse(entry)) == (1, 1)
    assert likes.remove(user, entry) is True
    assert (likes.count(user), likes.count_inverse(entry), likes.has(user, entry)) == (0, 0, False)


def test_counts_stay_exact_under_concurrent_adds_and_removes_on_one_and_two_servers(
    ds: DataStore,
) -> None:
    likes = Edges(ds, "likes", inverse="liked_by")
    entry = new_id()
    users = [new_id() for _ in range(48)]
    near = [u for u in users if _together(ds, u, entry)]
    assert 0 < len(near) < len(users)  # both kinds of pairs, the hot entry's server or not
    with ThreadPoolExecutor(16) as pool:
        added = list(pool.map(lambda u: likes.add(u, entry), users * 3))
        gone = list(pool.map(lambda u: likes.remove(u, entry), users[:16] * 3))
        again = list(pool.map(lambda u: likes.add(u, entry), users[:8] * 2))
    assert sum(added) == 48 and sum(gone) == 16 and sum(again) == 8
    assert likes.count_inverse(entry) == 40 == len(likes.page_inverse(entry, limit=100))
    assert [likes.count(u) for u in users] == [1] * 8 + [0] * 8 + [1] * 32
    assert likes.repair(grace=0) == 0


def _together(ds: DataStore, a: bytes, b: bytes) -> bool:
    topo = ds.cluster.current()
    servers = topo.shard_servers
    return servers[ds.cluster.shard_of_id(a)] == servers[ds.cluster.shard_of_id(b)]


def test_a_shard_moved_between_calls_is_followed_by_a_stale_map(
    make_store: Callable[..., DataStore], local_cluster: LocalCluster
) -> None:
    """A client whose map still has both shards on one server sends the batch there
    after the forward shard moved away: its first side applies, its second fails, the
    call follows the new map a side at a time, and the counts stay exact."""
    store = make_store(shards=4, refresh_interval=3600)
    likes = Edges(store, "likes", inverse="liked_by")
    user = new_id()
    entry = node_near(store, user, together=True)
    other = node_near(store, user, together=True)
    assert likes.add(user, entry) is True
    topo = store.cluster.topology
    shard = store.cluster.shard_of_id(user)
    there = next(sid for sid in topo.servers if sid != topo.shard_servers[shard])
    mover = same_store(local_cluster, store)
    try:
        ShardMover(mover).move(shard, there)
    finally:
        mover.close()
    assert store.cluster.topology.shard_servers[shard] != there  # the map is stale
    sent = traced(store)
    assert likes.add(user, other) is True
    assert store.cluster.topology.shard_servers[shard] == there
    assert len(sent) == 3  # the stale batch (its inverse applied), then a side at a time
    assert "edges__liked_by" in sent[0] and "edges__likes`" in sent[0]
    assert "edges__liked_by" in sent[1] and "edges__likes`" in sent[2]
    assert likes.add(user, other) is False and likes.add(user, entry) is False
    assert (likes.count(user), likes.count_inverse(entry), likes.count_inverse(other)) == (2, 1, 1)
    sent.clear()
    assert likes.remove(user, entry) is True and len(sent) == 2  # now on two servers
    assert (likes.count(user), likes.count_inverse(entry)) == (1, 0)
    assert likes.repair(grace=0) == 0
