"""Shard moves in the owned layout: the fence is the source's ``owned`` row, the copy
lives beside the target's other shards until its row is inserted, old rows are deleted
by ``drop_old_copies``; a mover stopped at any step resumes or rolls back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
from conftest import drop_datastore

from schemaless import DataStore, Index, failpoints, new_id
from schemaless.dsn import parse_address
from schemaless.local import LocalCluster
from schemaless.move import ShardMover
from schemaless.movesync import Side, Syncer, shard_tables
from schemaless.names import quote
from schemaless.owned import admin

BY_USER = Index("by_user", {"user": "int", "n": "int"}, shard_on="user")


def _state(store: DataStore, shard: int) -> dict[int, tuple[bool, int, int]]:
    """Per server: (owns the shard, its entity rows, its index rows) of that shard."""
    topo = store.cluster.refresh()
    db = str(topo.owned_db)
    out = {}
    for sid, server in store.cluster.all_servers(topo).items():
        got = server.run(
            admin(
                [
                    f"SELECT COUNT(*) FROM {quote(db, t)} WHERE `shard` = {shard}"
                    for t in ("owned", "entities", BY_USER.table)
                ]
            )
        )
        owns, entities, rows = (int(r[0][0]) for r in got)
        out[sid] = (bool(owns), entities, rows)
    return out


def _entities_on(store: DataStore, shard: int, n: int) -> list[dict[str, Any]]:
    """``n`` entities on logical shard ``shard``, stored (each with an index row)."""
    out: list[dict[str, Any]] = []
    while len(out) < n:
        key = new_id()
        if store.cluster.shard_of_id(key) == shard:
            out.append({"id": key, "user": len(out) % 3, "n": len(out)})
    store.put_many(out)
    return out


def _stop_at(mover: ShardMover, point: str, shard: int, target: int) -> None:
    """Run a move until the failpoint ``point`` raises, as a mover killed there."""
    failpoints.set(point, "raise")
    try:
        with pytest.raises(failpoints.FailpointError):
            mover.move(shard, target)
    finally:
        failpoints.clear(point)


@pytest.mark.parametrize("point", ["move.after_copy", "move.after_fence"])
def test_a_mover_stopped_resumes_or_rolls_back(make_store: Any, point: str) -> None:
    store = make_store(indexes=[BY_USER], move_wait=0.5)
    shard = 3
    entities = _entities_on(store, shard, 40)
    here = store.cluster.current().shard_servers[shard]
    there = 1 - here
    k = _state(store, shard)[here][2]  # the index rows on the shard (by user)
    _stop_at(ShardMover(store, chunk=7), point, shard, there)
    state = _state(store, shard)
    assert state[there] == (False, 40, k)  # copied, not owned
    assert state[here][0] == (point == "move.after_copy")  # fenced after the fence
    ShardMover(store).rollback(shard)
    assert _state(store, shard) == {here: (True, 40, k), there: (False, 0, 0)}
    assert not store.cluster.current().moves
    assert store.get_many(e["id"] for e in entities) == entities
    _stop_at(ShardMover(store, chunk=7), point, shard, there)
    report = ShardMover(store).move(shard, there)  # resumed
    assert report.verified["entities"][0] == 40
    assert _state(store, shard) == {here: (False, 40, k), there: (True, 40, k)}
    assert store.cluster.refresh().shard_servers[shard] == there
    store.put({**entities[0], "n": -1})
    assert store.get(entities[0]["id"]) == {**entities[0], "n": -1}
    assert list(store.iter(BY_USER, user=0, n=-1)) == [{**entities[0], "n": -1}]


_MOVER = """
import sys
from schemaless import DataStore
from schemaless.move import ShardMover
with DataStore(sys.argv[1].split(","), prefix=sys.argv[2], option_file=sys.argv[3]) as ds:
    ShardMover(ds).move(int(sys.argv[4]), int(sys.argv[5]))
"""


def test_a_mover_killed_after_the_targets_owned_row_resumes_or_rolls_back(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    """Past the target's ``owned`` row a failure rolls the move back by itself; a mover
    killed there (SIGKILL: the row inserted, the map not flipped) leaves the source
    fenced and the target owning: a resume flips, a rollback deletes the target's row
    and copy and gives the source its row back."""
    store = make_store(indexes=[BY_USER], move_wait=0.5)
    shard = 5
    entities = _entities_on(store, shard, 30)
    here = store.cluster.current().shard_servers[shard]
    there = 1 - here
    k = _state(store, shard)[here][2]
    _stop_at(ShardMover(store), "move.after_owned", shard, there)  # raised: rolled back
    assert _state(store, shard) == {here: (True, 30, k), there: (False, 0, 0)}
    assert not store.cluster.current().moves
    args = [
        ",".join(local_cluster.addresses),
        store.cluster.current().prefix,
        str(local_cluster.option_file),
        str(shard),
        str(there),
    ]
    env = {**os.environ, "SCHEMALESS_FAILPOINTS": "move.after_owned=kill"}
    for finish in ("rollback", "move"):
        killed = subprocess.run(
            [sys.executable, "-c", _MOVER, *args], env=env, capture_output=True, timeout=120
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
        assert _state(store, shard) == {here: (False, 30, k), there: (True, 30, k)}
        assert store.cluster.refresh().moves[shard][2] == "fenced"
        if finish == "rollback":
            ShardMover(store).rollback(shard)
            assert _state(store, shard) == {here: (True, 30, k), there: (False, 0, 0)}
        else:
            ShardMover(store).move(shard, there)
            assert store.cluster.refresh().shard_servers[shard] == there
    assert store.get_many(e["id"] for e in entities) == entities


def test_a_rollback_stopped_midway_finishes_when_run_again(make_store: Any) -> None:
    store = make_store(indexes=[BY_USER], move_wait=0.5)
    shard = 2
    entities = _entities_on(store, shard, 25)
    here = store.cluster.current().shard_servers[shard]
    k = _state(store, shard)[here][2]
    _stop_at(ShardMover(store), "move.after_fence", shard, 1 - here)
    failpoints.set("move.rollback.after_owned", "raise")
    try:
        with pytest.raises(failpoints.FailpointError):
            ShardMover(store).rollback(shard)
    finally:
        failpoints.clear("move.rollback.after_owned")
    assert _state(store, shard)[1 - here] == (False, 25, k)  # its copy still there
    assert store.cluster.refresh().moves  # the record too
    ShardMover(store).rollback(shard)
    assert _state(store, shard) == {here: (True, 25, k), 1 - here: (False, 0, 0)}
    assert store.get_many(e["id"] for e in entities) == entities


def test_the_fence_waits_for_a_writer_and_the_final_sync_takes_its_write(
    make_store: Any,
) -> None:
    store = make_store(indexes=[BY_USER])
    shard = 1
    entities = _entities_on(store, shard, 10)
    topo = store.cluster.current()
    here = topo.shard_servers[shard]
    db = str(topo.owned_db)
    entities_table = quote(db, "entities")
    source = store.cluster.all_servers(topo)[here]
    done: list[Any] = []
    with source.connection() as raw:  # a writer in its transaction: the guard's lock held
        raw.query(b"START TRANSACTION")
        raw.query(f"UPDATE {entities_table} SET `updated` = 7 WHERE `shard` = {shard}".encode())
        mover = threading.Thread(
            target=lambda: done.append(ShardMover(store).move(shard, 1 - here))
        )
        mover.start()
        time.sleep(1.5)
        assert not done and store.cluster.refresh().moves[shard][2] == "fencing"
        raw.query(b"COMMIT")
    mover.join(30)
    assert done and store.cluster.refresh().shard_servers[shard] == 1 - here
    target = store.cluster.all_servers(topo)[1 - here]
    rows = target.run(
        admin([f"SELECT DISTINCT `updated` FROM {entities_table} WHERE `shard` = {shard}"])
    )[0]
    assert [tuple(r) for r in rows] == [(7,)]
    assert len(store.get_many(e["id"] for e in entities)) == 10


def test_a_delete_landing_after_the_final_sync_is_synced_before_the_flip(
    make_store: Any,
) -> None:
    """Deletes are not guarded: one whose check passed before the fence may commit
    after it.  Verification fails, the final sync runs again, and passes."""
    store = make_store(indexes=[BY_USER])
    shard = 4
    entities = _entities_on(store, shard, 12)
    topo = store.cluster.current()
    here = topo.shard_servers[shard]
    source = store.cluster.all_servers(topo)[here]
    hits: list[int] = []

    def late_delete() -> None:
        hits.append(1)
        if len(hits) == 1:
            source.run(
                admin(
                    [
                        f"DELETE FROM {quote(str(topo.owned_db), 'entities')}"
                        f" WHERE `shard` = {shard} AND `id` = %s"
                    ]
                ),
                (entities[0]["id"],),
            )

    failpoints.set("move.before_verify", late_delete)
    try:
        report = ShardMover(store).move(shard, 1 - here)
    finally:
        failpoints.clear("move.before_verify")
    assert len(hits) == 2 and report.verified["entities"][0] == 11
    assert store.get(entities[0]["id"]) is None
    assert store.get(entities[1]["id"]) == entities[1]


def test_old_rows_are_deleted_in_chunks_and_never_a_holders(make_store: Any) -> None:
    store = make_store(indexes=[BY_USER])
    shard = 6
    entities = _entities_on(store, shard, 33)
    here = store.cluster.current().shard_servers[shard]
    k = _state(store, shard)[here][2]
    mover = ShardMover(store, chunk=5, pause=0.0)
    mover.move(shard, 1 - here)
    mover.move(shard, here)  # back onto its old rows: the diff makes them exact
    mover.move(shard, 1 - here)
    assert _state(store, shard) == {here: (False, 33, k), 1 - here: (True, 33, k)}
    topo = store.cluster.refresh()
    holder = Side(store.cluster.all_servers(topo)[1 - here], str(topo.owned_db), shard)
    assert Syncer(5, 1 << 20).delete(holder, shard_tables(topo), 0.0) == 0  # it owns them
    deletes: list[int] = []
    failpoints.set("move.after_drop", lambda: deletes.append(1))
    try:
        dropped = mover.drop_old_copies()
    finally:
        failpoints.clear("move.after_drop")
    assert dropped == [f"{topo.servers[here]}/{topo.owned_db} shard {shard} ({33 + k} rows)"]
    assert _state(store, shard) == {here: (False, 0, 0), 1 - here: (True, 33, k)}
    assert mover.drop_old_copies() == []
    assert store.get_many(e["id"] for e in entities) == entities


def _on_the_first(local_cluster: LocalCluster, *indexes: Index) -> DataStore:
    """A new datastore of four logical shards on the cluster's first server alone."""
    return DataStore(
        [local_cluster.addresses[0]],
        list(indexes),
        prefix="t_" + uuid.uuid4().hex[:12],
        shards=4,
        refresh_interval=0.2,
        option_file=str(local_cluster.option_file),
    )


def test_a_server_added_gets_its_tables_before_anything_names_them(
    local_cluster: LocalCluster,
) -> None:
    second = parse_address(local_cluster.addresses[1])[0]
    store = _on_the_first(local_cluster, BY_USER)
    try:
        entities = _entities_on(store, 0, 15)
        mover = ShardMover(store)
        mover.prepare_server(second)
        store.cluster.catalog.add_server(second)
        # a declaration creates its tables on every server, shards or not
        assert store.declare_index(Index("by_n", {"n": "int"})) == "building"
        mover.move(0, 1)
        assert store.cluster.refresh().shard_servers == (1, 0, 0, 0)
        assert store.get_many(e["id"] for e in entities) == entities
        store.put({"id": new_id(), "user": 1, "n": 99})  # every shard writes
        assert len(list(store.iter(BY_USER, user=0))) == 5
    finally:
        drop_datastore(store)


def test_a_shard_moves_to_a_new_server_past_a_dropped_index(
    local_cluster: LocalCluster,
) -> None:
    """A new user's rebalance onto an added server failed on ``index_c4 doesn't
    exist``: the server got the maintained indexes' tables, the move copied every
    index's, the dropped one (not purged) too."""
    second = parse_address(local_cluster.addresses[1])[0]
    store = _on_the_first(local_cluster, BY_USER, Index("by_gone", {"n": "int"}))
    try:
        entities = _entities_on(store, 0, 10)
        store.drop_index("by_gone")
        mover = ShardMover(store)
        mover.prepare_server(second)
        store.cluster.catalog.add_server(second)
        assert mover.move(0, 1).rows_copied > 0
        assert store.cluster.refresh().shard_servers == (1, 0, 0, 0)
        assert store.get_many(e["id"] for e in entities) == entities
        store.purge_index("by_gone")  # its tables gone from both servers
        assert "by_gone" not in store.indexes()
    finally:
        drop_datastore(store)


def test_the_feeds_rows_and_head_travel_with_the_shard(make_store: Any) -> None:
    """The change rows keep their numbers and the head row comes with the copy: the
    next write on the target takes the next number (the feed's reading is tested in
    test_feed.py)."""
    store = make_store(changes=True, shards=4)
    shard = 2
    entities = _entities_on(store, shard, 12)
    topo = store.cluster.current()
    here = topo.shard_servers[shard]
    db = str(topo.owned_db)

    def feed(sid: int) -> tuple[int, int, int]:
        server = store.cluster.all_servers(topo)[sid]
        got = server.run(
            admin(
                [
                    f"SELECT COUNT(*), COALESCE(MAX(`seq`), 0) FROM {quote(db, 'changes')}"
                    f" WHERE `shard` = {shard}",
                    f"SELECT COALESCE(MAX(`seq`), -1) FROM {quote(db, 'changes_head')}"
                    f" WHERE `shard` = {shard}",
                ]
            )
        )
        return int(got[0][0][0]), int(got[0][0][1]), int(got[1][0][0])

    before = feed(here)
    assert before[0] == 12 and before[2] == before[1]
    ShardMover(store).move(shard, 1 - here)
    assert feed(1 - here) == before
    store.put({**entities[0], "n": -1})
    assert feed(1 - here) == (13, before[1] + 1, before[1] + 1)


def test_edges_and_a_feeds_pulled_list_move_with_their_shard(make_store: Any) -> None:
    """Tables a module makes on first use (schemaless.edges, schemaless.feeds) move with
    the shard's rows (and a server-wide list whole), and drop-old clears the source."""
    from schemaless import Edges

    store = make_store(shards=4)
    likes = Edges(store, "likes", inverse="liked_by")
    users = [new_id() for _ in range(12)]
    entry = new_id()
    for u in users:
        likes.add(u, entry)
    topo = store.cluster.topology
    shard = store.cluster.shard_of_id(users[0])
    here = topo.shard_servers[shard]
    there = next(sid for sid in topo.servers if sid != here)
    db = topo.owned_db
    assert db is not None
    wide = f"`{db}`.`feed__x__pulled`"  # as a feed's pulled list: no shard, on every server
    src = store.cluster.server_of_shard(topo, shard)
    src.run(admin([f"CREATE TABLE {wide} (`author` BINARY(16) NOT NULL PRIMARY KEY)"]))
    src.run(admin([f"INSERT INTO {wide} VALUES (%s)"]), [entry])
    moved = [u for u in users if store.cluster.shard_of_id(u) == shard]
    ShardMover(store).move(shard, there)
    store.cluster.refresh()
    for u in moved:
        assert likes.has(u, entry) and likes.count(u) == 1
    assert likes.count_inverse(entry) == len(users)
    dst = store.cluster.server_of_shard(store.cluster.refresh(), shard)
    assert dst.run(admin([f"SELECT COUNT(*) FROM {wide}"]))[0][0][0] == 1
    ShardMover(store).drop_old_copies()
    left = src.run(admin([f"SELECT COUNT(*) FROM `{db}`.`edges__likes` WHERE `shard` = {shard}"]))[
        0
    ][0][0]
    assert left == 0
    likes.add(moved[0], new_id())  # the moved shard takes writes on its new server
    assert likes.count(moved[0]) == 2
