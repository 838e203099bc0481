"""The count trigger of ``Edges.add`` (schemaless.edges) on real servers: a side is
one statement whose ``AFTER INSERT`` trigger counts a new edge; counts stay exact under
concurrent adds, for tables made before the trigger (the transaction, then an upgrade
while a client still uses it), through a move whose target gets its tables from the
move, through a restore, and for the application's user."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_cli import Cli, cluster_env
from test_edges_together import node_near
from test_feeds_grants import admin_datastore
from test_grants import User, new_users, open_as

from schemaless import DataStore, Edges, ServerError, new_id
from schemaless.dump import read_manifest
from schemaless.dumptables import restore_tables, table_dumps
from schemaless.edgetables import NOCOUNT
from schemaless.grants import apply_grants
from schemaless.local import LocalCluster
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import TRIGGERED, admin


@pytest.fixture
def ds(make_store: Callable[..., DataStore]) -> DataStore:
    return make_store()


def triggers(ds: DataStore, table: str) -> dict[int, int]:
    """How many count triggers ``table`` has on each server (as the admin sees them)."""
    topo = ds.cluster.refresh()
    sql = (
        "SELECT COUNT(*) FROM information_schema.triggers WHERE trigger_schema = %s"
        " AND event_object_table = %s AND action_timing = 'AFTER'"
    )
    return {
        sid: int(server.run(sql, (topo.owned_db, table))[0][0][0])
        for sid, server in sorted(ds.cluster.all_servers(topo).items())
    }


def update_guards(ds: DataStore, *tables: str) -> dict[int, int]:
    """How many ``BEFORE UPDATE`` guards the ``tables`` have on each server (an edge
    table has one, beside its key; a count table none: it is written by upserts, and by
    the count trigger under its edge's key)."""
    topo = ds.cluster.refresh()
    marks = ", ".join(["%s"] * len(tables))
    sql = (
        "SELECT COUNT(*) FROM information_schema.triggers WHERE trigger_schema = %s"
        f" AND event_object_table IN ({marks}) AND event_manipulation = 'UPDATE'"
    )
    return {
        sid: int(server.run(sql, (topo.owned_db, *tables))[0][0][0])
        for sid, server in sorted(ds.cluster.all_servers(topo).items())
    }


def drop_triggers(ds: DataStore, *tables: str) -> None:
    """Make the tables as they were before the count trigger."""
    topo = ds.cluster.current()
    db = str(topo.owned_db)
    for server in ds.cluster.all_servers(topo).values():
        server.run(admin([f"DROP TRIGGER IF EXISTS {quote(db, f'{t}_ci')}" for t in tables]))


def edge_rows(ds: DataStore, table: str, node: bytes) -> int:
    """The rows of ``node`` in an edge table, read on the server of its shard."""
    topo = ds.cluster.refresh()
    shard = ds.cluster.shard_of_id(node)
    sql = (
        f"SELECT COUNT(*) FROM {quote(str(topo.owned_db), table)} WHERE `shard` = %s AND `src` = %s"
    )
    return int(ds.cluster.server_of_shard(topo, shard).run(admin([sql]), (shard, node))[0][0][0])


def test_a_side_is_one_statement_and_adding_twice_counts_once(ds: DataStore) -> None:
    likes = Edges(ds, "likes", inverse="liked_by")
    assert set(triggers(ds, "edges__likes").values()) == {1}
    assert set(triggers(ds, "edges__liked_by").values()) == {1}
    assert triggers(ds, "edges__likes__n") == dict.fromkeys(ds.cluster.topology.servers, 0)
    user = new_id()
    entry = node_near(ds, user, together=False)  # a side a round trip
    assert likes.add(user, entry) is True
    sent: list[str] = []
    for server in ds.cluster.servers():
        server.tracer = lambda name, sql, s: sent.append(sql)
    assert likes.add(user, entry, data={"again": 1}) is False
    assert likes.add(user, entry) is False
    sides = [sql for sql in sent if "edges__" in sql]
    assert len(sides) == 4 and all(s.startswith(f"{TRIGGERED} INSERT") for s in sides)
    assert (likes.count(user), likes.count_inverse(entry)) == (1, 1)
    assert likes.page(user)[0].data is None  # a present edge keeps its data
    assert likes.remove(user, entry) is True and likes.count(user) == 0
    assert likes.add(user, entry) is True
    assert (likes.count(user), likes.count_inverse(entry)) == (1, 1)


def test_counts_stay_exact_under_concurrent_adds_of_the_same_and_different_edges(
    ds: DataStore,
) -> None:
    likes = Edges(ds, "likes", inverse="liked_by")
    entry = new_id()
    users = [new_id() for _ in range(30)]
    pairs = [(u, entry) for u in users] + [(u, new_id()) for u in users]
    with ThreadPoolExecutor(16) as pool:
        new = list(pool.map(lambda p: likes.add(*p), pairs * 3))
    assert sum(new) == len(pairs)  # each edge new exactly once
    assert likes.count_inverse(entry) == 30 == edge_rows(ds, "edges__liked_by", entry)
    assert all(likes.count(u) == 2 == edge_rows(ds, "edges__likes", u) for u in users)
    assert likes.counts_inverse([dst for _, dst in pairs[30:]]) == {dst: 1 for _, dst in pairs[30:]}


def test_tables_without_the_trigger_count_in_a_transaction_and_once_after_the_upgrade(
    ds: DataStore, local_cluster: LocalCluster
) -> None:
    Edges(ds, "likes", inverse="liked_by")
    drop_triggers(ds, "edges__likes", "edges__liked_by")
    old = Edges(ds, "likes", inverse="liked_by")  # the tables exist: nothing created
    assert set(triggers(ds, "edges__likes").values()) == {0}
    entry = new_id()
    # the first, third and fifth like in one batch with their inverse (test_edges_together)
    users = [node_near(ds, entry, together=i % 2 == 0) for i in range(6)]
    sent: list[str] = []
    for server in ds.cluster.servers():
        server.tracer = lambda name, sql, s: sent.append(sql)
    for u in users[:3]:
        assert old.add(u, entry) is True and old.add(u, entry) is False
    sides = [s for s in sent if "edges__" in s]
    assert len(sides) == 2 * 4 and all(s.count(f"SET {NOCOUNT} = 1") == 2 for s in sides[:2])
    assert all(f"SET {NOCOUNT} = 1" in s and s.endswith("COMMIT") for s in sides)
    assert old.count_inverse(entry) == 3 and old.count(users[0]) == 1

    upgraded = Cli(cluster_env(local_cluster, ds.cluster.topology.prefix)).ok(
        "edges", "create", "likes", "--inverse", "liked_by"
    )
    assert "edge type likes/liked_by" in upgraded.output
    assert set(triggers(ds, "edges__likes").values()) == {1}
    for u in users[3:5]:  # ``old`` still takes the tables for untriggered: no double count
        assert old.add(u, entry) is True and old.add(u, entry) is False
    assert old.count_inverse(entry) == 5 and old.count(users[3]) == 1
    sent.clear()
    fresh = Edges(ds, "likes", inverse="liked_by")
    assert fresh.add(users[5], entry) is True
    sides = [s for s in sent if "edges__" in s]
    assert len(sides) == 2 and all(s.startswith(f"{TRIGGERED} INSERT") for s in sides)
    assert fresh.count_inverse(entry) == 6 == edge_rows(ds, "edges__liked_by", entry)
    assert fresh.count(users[5]) == 1


def test_a_move_copies_counts_exactly_and_a_target_it_gives_tables_gets_the_trigger(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store(shards=4)
    likes = Edges(store, "likes")
    topo = store.cluster.topology
    db = str(topo.owned_db)
    shard = 1
    here = topo.shard_servers[shard]
    there = next(sid for sid in topo.servers if sid != here)
    target = store.cluster.all_servers(topo)[there]
    # the target has no edge tables yet (as a server added since): the move makes them
    target.run(admin([f"DROP TABLE {quote(db, t)}" for t in ("edges__likes", "edges__likes__n")]))
    nodes: list[bytes] = []
    while len(nodes) < 5:
        node = new_id()
        if store.cluster.shard_of_id(node) == shard:
            nodes.append(node)
    for i, node in enumerate(nodes):
        for dst in [new_id() for _ in range(i + 1)]:
            likes.add(node, dst)
            likes.add(node, dst)
    assert [likes.count(n) for n in nodes] == [1, 2, 3, 4, 5]
    ShardMover(store).move(shard, there)
    assert store.cluster.refresh().shard_servers[shard] == there
    assert triggers(store, "edges__likes")[there] == 1
    assert set(update_guards(store, "edges__likes__n").values()) == {0}
    assert set(update_guards(store, "edges__likes").values()) == {1}
    assert [likes.count(n) for n in nodes] == [1, 2, 3, 4, 5]  # the copy was not counted
    assert [edge_rows(store, "edges__likes", n) for n in nodes] == [1, 2, 3, 4, 5]
    present = likes.page(nodes[0])[0].dst
    assert likes.add(nodes[0], present) is False and likes.add(nodes[0], new_id()) is True
    assert likes.count(nodes[0]) == 2 == edge_rows(store, "edges__likes", nodes[0])


def test_a_restore_writes_edges_uncounted_with_their_counts_and_the_trigger(
    make_store: Callable[..., DataStore], local_cluster: LocalCluster, tmp_path: Path
) -> None:
    """The restored edge tables get the count trigger, and their rows are not counted
    by it (their counts are rows of the dump too), whichever table comes first."""
    src = make_store(shards=4)
    likes = Edges(src, "likes", inverse="liked_by")
    entry, users = new_id(), [new_id() for _ in range(5)]
    for u in users:
        likes.add(u, entry)
        likes.add(u, new_id())
    out = tmp_path / "d"
    Cli(cluster_env(local_cluster, src.cluster.topology.prefix)).ok("dump", str(out))
    tables = table_dumps(read_manifest(out))
    assert [t.name for t in tables][:2] == ["edges__liked_by", "edges__liked_by__n"]

    target = make_store(shards=3)
    counts_first = sorted(tables, key=lambda t: not t.name.endswith("__n"))
    restore_tables(target, target.cluster.current(), out, "t", counts_first, 1, None)
    assert set(triggers(target, "edges__likes").values()) == {1}
    assert set(update_guards(target, "edges__likes__n").values()) == {0}
    assert set(update_guards(target, "edges__likes").values()) == {1}
    restored = Edges(target, "likes", inverse="liked_by")
    assert restored.count_inverse(entry) == 5 == edge_rows(target, "edges__liked_by", entry)
    assert all(restored.count(u) == 2 for u in users)
    assert restored.add(users[0], entry) is False and restored.add(users[0], new_id()) is True
    assert restored.count(users[0]) == 3 == edge_rows(target, "edges__likes", users[0])


@pytest.fixture
def app_store(local_cluster: LocalCluster) -> Iterator[tuple[DataStore, User]]:
    """A new datastore opened as the admin, and an application user with its grants."""
    with (
        admin_datastore(local_cluster, "edgetrig") as admin_ds,
        new_users(local_cluster, uuid.uuid4().hex[:8], ("app",)) as made,
    ):
        apply_grants(admin_ds, "app", made["app"].account)
        yield admin_ds, made["app"]


def test_the_application_user_finds_the_trigger_and_adds_by_it(
    local_cluster: LocalCluster, app_store: tuple[DataStore, User]
) -> None:
    """The application's user (no TRIGGER privilege) sees the count trigger in
    ``information_schema`` and adds in one statement a side."""
    admin_ds, user = app_store
    Edges(admin_ds, "likes", inverse="liked_by")  # the admin creates the tables
    with open_as(local_cluster, admin_ds, user) as ds:
        likes = Edges(ds, "likes", inverse="liked_by")
        sent: list[str] = []
        for server in ds.cluster.servers():
            server.tracer = lambda name, sql, s: sent.append(sql)
        a = new_id()
        b = node_near(ds, a, together=False)  # a side a round trip
        assert likes.add(a, b) is True and likes.add(a, b) is False
        sides = [s for s in sent if "edges__" in s]
        assert len(sides) == 4 and all(s.startswith(f"{TRIGGERED} INSERT") for s in sides)
        assert (likes.count(a), likes.count_inverse(b)) == (1, 1)


def refuse_count_inserts(ds: DataStore, table: str) -> None:
    """Swap the count table's insert guard for one that refuses every row: a write that
    fires it fails (``ServerError``, "count guard fired")."""
    topo = ds.cluster.current()
    db = str(topo.owned_db)
    guard, target = quote(db, f"{table}_gi"), quote(db, table)
    for server in ds.cluster.all_servers(topo).values():
        server.run(admin([f"DROP TRIGGER {guard}"]))
        server.run(
            admin(
                [
                    f"CREATE TRIGGER {guard} BEFORE INSERT ON {target} FOR EACH ROW"
                    " SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'count guard fired'"
                ]
            )
        )


def test_the_trigger_updates_a_present_count_past_its_guard_and_upserts_a_new_one(
    ds: DataStore,
) -> None:
    """The count trigger updates a node's present count row, which fires no guard of
    the count table (the edge's insert guard has checked the shard), and inserts a new
    node's through the count table's insert guard, which still refuses it."""
    likes = Edges(ds, "likes")
    user = new_id()
    assert likes.add(user, new_id()) is True  # the count row is made
    refuse_count_inserts(ds, "edges__likes__n")
    assert likes.add(user, new_id()) is True and likes.add(user, new_id()) is True
    assert likes.count(user) == 3 == edge_rows(ds, "edges__likes", user)
    stranger = new_id()
    with pytest.raises(ServerError, match="count guard fired"):
        likes.add(stranger, new_id())
    assert likes.count(stranger) == 0 == edge_rows(ds, "edges__likes", stranger)


def test_concurrent_first_edges_of_new_nodes_count_each_once(ds: DataStore) -> None:
    """Threads adding the first edges of the same new nodes at once (each finds no count
    row to update, then upserts it; READ COMMITTED: no gap lock, no deadlock) and of one
    hot node: every count exact."""
    likes = Edges(ds, "likes", inverse="liked_by")
    users, entry = [new_id() for _ in range(12)], new_id()
    pairs = [(u, new_id()) for u in users for _ in range(4)] + [(u, entry) for u in users]
    with ThreadPoolExecutor(16) as pool:
        new = list(pool.map(lambda p: likes.add(*p), pairs + pairs[::-1]))
    assert sum(new) == len(pairs)
    assert all(likes.count(u) == 5 == edge_rows(ds, "edges__likes", u) for u in users)
    assert likes.count_inverse(entry) == 12 == edge_rows(ds, "edges__liked_by", entry)
