"""Online shard moves between the local cluster's servers, with writers running."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import pytest
from conftest import assert_clean, same_store

from schemaless import CatalogError, Index, TableMissing, failpoints, new_id
from schemaless import move as move_module
from schemaless.cleaner import Cleaner
from schemaless.cleaner import verify as verify_module
from schemaless.cleaner.verify import diff_indexes
from schemaless.local import LocalCluster
from schemaless.move import ShardMover, rebalance_plan
from schemaless.names import quote

BY_USER = Index("by_user", {"user": "int", "n": "int"}, shard_on="user")


def test_moves_back_and_forth_lose_nothing(make_store: Any) -> None:
    store = make_store(indexes=[BY_USER])
    keys = [new_id() for _ in range(300)]
    store.put_many({"id": k, "user": i % 7, "n": i} for i, k in enumerate(keys))
    acked: dict[bytes, int | None] = {
        k: i for i, k in enumerate(keys)
    }  # last acked n, None: deleted
    lock = threading.Lock()
    stop = threading.Event()
    pauses: list[float] = []
    errors: list[BaseException] = []

    def write(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            while not stop.is_set():
                key = rnd.choice(keys)
                started = time.monotonic()
                if rnd.random() < 0.2:
                    with lock:
                        store.delete(key)
                        acked[key] = None
                else:
                    n = rnd.randrange(10**6)
                    with lock:
                        store.put({"id": key, "user": n % 7, "n": n})
                        acked[key] = n
                pauses.append(time.monotonic() - started)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    mover = ShardMover(store, chunk=50)
    topo = store.cluster.current()
    reports = []
    try:
        for shard in (0, 1, 2, 0):
            here = store.cluster.current().shard_servers[shard]
            there = next(sid for sid in topo.servers if sid != here)
            reports.append(mover.move(shard, there))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, [repr(e) for e in errors]
    assert store.cluster.current().shard_servers[0] == topo.shard_servers[0]  # moved back
    assert store.cluster.current().shard_servers[1] != topo.shard_servers[1]
    assert store.cluster.current().map_version == topo.map_version + 4
    for report in reports:
        assert report.verified["entities"][0] > 0
    got = store.get_many(keys)
    for key, entity in zip(keys, got, strict=True):
        if acked[key] is None:
            assert entity is None  # deletes during the move did not come back
        else:
            assert entity is not None and entity["n"] == acked[key]
    for name, diff in diff_indexes(store).items():
        assert diff.missing == {} and diff.behind == {}, name
    print(
        f"longest write pause: {max(pauses) * 1000:.0f} ms; "
        f"fenced pauses: {[round(r.pause_seconds * 1000) for r in reports]} ms"
    )
    assert mover.drop_old_copies()


def test_dry_run_rebalance_and_refusals(make_store: Any) -> None:
    store = make_store()
    topo = store.cluster.current()
    mover = ShardMover(store)
    report = mover.move(3, 1 - topo.shard_servers[3], dry_run=True)
    assert report.dry_run and store.cluster.refresh().shard_servers == topo.shard_servers
    with pytest.raises(CatalogError, match="unknown server"):
        mover.move(3, "10.0.0.1:1")
    with pytest.raises(CatalogError, match="no logical shard"):
        mover.move(99, 0)
    assert rebalance_plan(topo) == []  # 8 shards on 2 servers: even
    mover.move(0, 1 - topo.shard_servers[0])
    mover.move(2, 1 - topo.shard_servers[2])
    plan = rebalance_plan(store.cluster.refresh())  # now 2 and 6 shards: two moves back
    assert len(plan) == 2 and all(src != dst for _, src, dst in plan)
    for shard, _, dst in plan:
        mover.move(shard, dst)
    counts = [len(store.cluster.refresh().shards_of(sid)) for sid in topo.servers]
    assert counts == [4, 4]


def _die_after_fence(mover: ShardMover, shard: int, target: int) -> None:
    """Run a move up to its fence, as a mover killed right after it would leave it."""
    failpoints.set("move.after_fence", "raise")
    try:
        with pytest.raises(failpoints.FailpointError):
            mover.move(shard, target)
    finally:
        failpoints.clear("move.after_fence")


def test_an_interrupted_move_resumes_or_rolls_back(make_store: Any) -> None:
    store = make_store(indexes=[BY_USER], move_wait=0.5)
    entities = [{"id": new_id(), "user": i % 3, "n": i} for i in range(200)]
    store.put_many(entities)
    topo = store.cluster.current()
    shard = store.cluster.shard_of_id(entities[0]["id"])
    here = topo.shard_servers[shard]
    there = 1 - here
    # Killed after the fence: writers to that shard wait (and give up after move_wait).
    _die_after_fence(ShardMover(store), shard, there)
    with pytest.raises(TableMissing):
        store.get(entities[0]["id"])
    # Run again: the move finishes from the fenced copy.
    report = ShardMover(store).move(shard, there)
    assert report.verified["entities"][0] > 0
    assert store.cluster.refresh().shard_servers[shard] == there
    assert store.get_many(e["id"] for e in entities) == entities
    # Killed again after the fence of a move back: roll back instead.
    _die_after_fence(ShardMover(store), shard, here)
    ShardMover(store).rollback(shard)
    assert store.cluster.refresh().shard_servers[shard] == there
    assert not store.cluster.current().moves
    store.put({"id": entities[0]["id"], "user": 0, "n": -1})
    assert store.get(entities[0]["id"]) == {"id": entities[0]["id"], "user": 0, "n": -1}
    for diff in diff_indexes(store).values():
        assert diff.missing == {} and diff.behind == {}


def test_a_move_killed_during_its_fence_resumes_or_rolls_back(make_store: Any) -> None:
    """The side copy is named in the move record before the rename."""
    store = make_store(indexes=[BY_USER], move_wait=0.5)
    entities = [{"id": new_id(), "user": i % 3, "n": i} for i in range(100)]
    store.put_many(entities)
    shard = store.cluster.shard_of_id(entities[0]["id"])
    here = store.cluster.current().shard_servers[shard]
    failpoints.set("move.after_fence", "raise")
    try:
        with pytest.raises(failpoints.FailpointError):
            ShardMover(store).move(shard, 1 - here)
        assert store.cluster.refresh().moves[shard][2].startswith("fencing")
        ShardMover(store).rollback(shard)
        assert store.get_many(e["id"] for e in entities) == entities
        with pytest.raises(failpoints.FailpointError):
            ShardMover(store).move(shard, 1 - here)
    finally:
        failpoints.clear("move.after_fence")
    ShardMover(store).move(shard, 1 - here)
    assert store.cluster.refresh().shard_servers[shard] == 1 - here
    assert store.get_many(e["id"] for e in entities) == entities


def test_a_shard_moved_out_of_a_server_twice_in_one_second_keeps_both_old_copies(
    make_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each move off a server gets its own side database, even when the clock gives the
    same second (a scripted rebalance of a small shard): the second move used to fail
    renaming into the first one's ("Table 'entities' already exists")."""
    store = make_store(indexes=[BY_USER], layout="databases")
    entities = [{"id": new_id(), "user": i % 3, "n": i} for i in range(40)]
    store.put_many(entities)
    shard = store.cluster.shard_of_id(entities[0]["id"])
    here = store.cluster.current().shard_servers[shard]
    monkeypatch.setattr(move_module, "time", _FrozenWallClock)
    mover = ShardMover(store)
    for target in (1 - here, here, 1 - here, here):
        assert mover.move(shard, target).verified["entities"][0] > 0
    assert store.cluster.refresh().shard_servers[shard] == here
    assert store.get_many(e["id"] for e in entities) == entities
    db = store.cluster.current().dbs[shard]
    assert sorted(d.rsplit("/", 1)[1] for d in mover.drop_old_copies()) == sorted(
        f"{db}_old{_FrozenWallClock.now + i}" for i in (0, 0, 1, 1)
    )


def test_one_process_at_a_time_moves_a_shard(make_store: Any) -> None:
    """A second mover of a shard being moved is refused (it used to run the same move
    alongside, each renaming the other's tables); other shards still move."""
    store = make_store(indexes=[BY_USER])
    entities = [{"id": new_id(), "user": i % 3, "n": i} for i in range(60)]
    store.put_many(entities)
    topo = store.cluster.current()
    shard = store.cluster.shard_of_id(entities[0]["id"])
    other = next(s for s in range(topo.n_shards) if s != shard)
    fenced, go_on = threading.Event(), threading.Event()

    def hold() -> None:
        fenced.set()
        assert go_on.wait(30)

    failpoints.set("move.after_fence", hold)
    first = threading.Thread(
        target=ShardMover(store).move, args=(shard, 1 - topo.shard_servers[shard])
    )
    first.start()
    try:
        assert fenced.wait(30)
        failpoints.clear("move.after_fence")
        for attempt in (
            lambda: ShardMover(store).move(shard, 1 - topo.shard_servers[shard]),
            lambda: ShardMover(store).rollback(shard),
        ):
            with pytest.raises(CatalogError, match="being moved or rolled back by another"):
                attempt()
        ShardMover(store).move(other, 1 - topo.shard_servers[other])
    finally:
        go_on.set()
        first.join()
    now = store.cluster.refresh()
    assert (now.shard_servers[shard], now.shard_servers[other]) == (
        1 - topo.shard_servers[shard],
        1 - topo.shard_servers[other],
    )
    assert not now.moves
    assert store.get_many(e["id"] for e in entities) == entities
    ShardMover(store).move(shard, topo.shard_servers[shard])  # the lock was released


class _FrozenWallClock:
    """``time`` for schemaless.move, whose wall clock stands still."""

    now = 1_700_000_000
    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def time() -> float:
        return float(_FrozenWallClock.now)


def test_a_move_whose_side_copy_is_gone_fails_instead_of_flipping(make_store: Any) -> None:
    """A database per logical shard: the fenced side copy is the only one left."""
    store = make_store(indexes=[BY_USER], move_wait=0.5, layout="databases")
    entities = [{"id": new_id(), "user": i % 3, "n": i} for i in range(50)]
    store.put_many(entities)
    shard = store.cluster.shard_of_id(entities[0]["id"])
    topo = store.cluster.current()
    here = topo.shard_servers[shard]
    _die_after_fence(ShardMover(store), shard, 1 - here)
    source = store.cluster.server_of_shard(topo, shard)
    side = store.cluster.refresh().moves[shard][2].partition(":")[2]
    source.run(f"DROP DATABASE {quote(side)}")
    with pytest.raises(CatalogError, match="no entities table"):
        ShardMover(store).move(shard, 1 - here)
    assert store.cluster.refresh().shard_servers[shard] == here


def test_a_backfill_follows_the_shards_that_move_under_it(
    make_store: Any, local_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Both lanes hold a batch read on the old map when logical shard 0 has moved and
    shard 1 is fenced for its move: the backfill carries on with the new map, waits for
    the recorded move, and builds the whole index."""
    store = make_store(shards=2)  # one logical shard per server: one backfill lane each
    store.put_many({"user": i % 7, "n": i} for i in range(300))
    assert store.declare_index(BY_USER) == "building"
    topo = store.cluster.refresh()
    mover = same_store(local_cluster, store)  # another client, as the CLI would be
    fenced = threading.Event()
    lanes: set[int] = set()
    errors: list[BaseException] = []
    second: list[threading.Thread] = []

    def hold_the_fence() -> None:
        fenced.set()
        time.sleep(1.0)  # shard 1's tables are gone and its move is recorded meanwhile

    def move_shard_1() -> None:
        try:
            ShardMover(mover, chunk=50).move(1, topo.shard_servers[0])
        except BaseException as exc:
            errors.append(exc)

    def move_both() -> None:
        ShardMover(mover, chunk=50).move(0, topo.shard_servers[1])
        failpoints.set("move.after_fence", hold_the_fence)
        second.append(threading.Thread(target=move_shard_1))
        second[0].start()
        assert fenced.wait(30)

    both_read = threading.Barrier(2, action=move_both, timeout=120)

    def first_batch_of_each_lane() -> None:
        if threading.get_ident() not in lanes:
            lanes.add(threading.get_ident())
            both_read.wait()

    failpoints.set("cleaner.after_read", first_batch_of_each_lane)
    caplog.set_level(logging.INFO, logger="schemaless.cleaner")
    try:
        state = Cleaner(store, batch=50).backfill("by_user")
    finally:
        for t in second:
            t.join()
        mover.close()
    assert not errors, errors
    assert state == "ready"
    moved = store.cluster.refresh()
    assert moved.shard_servers == (topo.shard_servers[1], topo.shard_servers[0])
    assert not moved.moves
    log = caplog.text
    # A lane that meets the old map first says "the map changed"; on a loaded machine
    # the map's own refresh (every 0.2 s here) may beat it, and both lanes only wait.
    assert "waiting for the move of logical shard(s) 1" in log
    assert_clean(store)


def test_a_cleaner_pass_follows_a_shard_that_moves_under_it(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    """Logical shard 1 moves (another client) after the pass's first batch, planned on
    the old map: the recent pass, the sweep and the purge all read it on its new server."""
    store = make_store(indexes=[BY_USER], shards=2)
    store.put_many({"user": i % 7, "n": i} for i in range(120))
    topo = store.cluster.refresh()
    mover = same_store(local_cluster, store)
    moved: list[Any] = []

    def move_once() -> None:
        if not moved:
            moved.append(ShardMover(mover, chunk=50).move(1, topo.shard_servers[0]))

    failpoints.set("cleaner.after_batch", move_once)
    try:
        figures = Cleaner(store, batch=20).run_once()
    finally:
        mover.close()
    assert moved and store.cluster.refresh().shard_servers[1] == topo.shard_servers[0]
    assert figures["rows_checked"] >= 3 * 120  # recent: entities and rows; sweep: rows
    assert_clean(store)


def test_verify_starts_again_when_a_shard_moves_under_it(
    make_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cleaner verify`` (``diff_indexes``) reads every shard on the map it loaded; a
    shard moved meanwhile made it fail with TableMissing.  It now starts again on the
    new map, and finds the index exact."""
    store = make_store(indexes=[BY_USER])
    store.put_many({"id": new_id(), "user": i % 5, "n": i} for i in range(80))
    here = store.cluster.current().shard_servers[0]
    real = verify_module.entity_batches
    moved: list[Any] = []

    def entity_batches(store_: Any, topo: Any, shard: int, *args: Any) -> Any:
        if shard == 1 and not moved:  # shard 0 read on the old map: now it moves
            moved.append(ShardMover(store).move(0, 1 - here))
        return real(store_, topo, shard, *args)

    monkeypatch.setattr(verify_module, "entity_batches", entity_batches)
    diffs = diff_indexes(store)
    assert moved and store.cluster.current().shard_servers[0] == 1 - here
    assert {name: d.summary() for name, d in diffs.items() if not d.clean} == {}


def test_old_copies_of_another_datastore_are_left_alone(make_store: Any) -> None:
    """Another datastore's prefix may begin with this one's and an underscore."""
    store = make_store(layout="databases")
    topo = store.cluster.current()
    server = store.cluster.server_of_shard(topo, 0)
    theirs = [f"{topo.prefix}_b_0001_old5", f"{topo.prefix}_0001_old5_0000"]
    mine = f"{topo.prefix}_0001_old5"
    try:
        for db in [*theirs, mine]:
            server.run(f"CREATE DATABASE {quote(db)}")
        dropped = ShardMover(store).drop_old_copies()
        assert [d.rpartition("/")[2] for d in dropped] == [mine]
        left = server.run(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
            (f"{topo.prefix}%",),
        )[0]
        assert set(theirs) <= {r[0] for r in left}
    finally:
        for db in theirs:
            server.run(f"DROP DATABASE IF EXISTS {quote(db)}")


def test_an_index_declared_during_a_move_follows_the_shard(make_store: Any) -> None:
    by_n = Index("by_n", {"n": "int"}, shard_on="n")
    store = make_store(indexes=[BY_USER], move_wait=0.5)
    entities = [{"id": new_id(), "user": i % 3, "n": i} for i in range(100)]
    store.put_many(entities)
    shard = store.cluster.shard_of_id(entities[0]["id"])
    here = store.cluster.current().shard_servers[shard]
    _die_after_fence(ShardMover(store), shard, 1 - here)
    with pytest.raises(CatalogError, match="being moved"):
        store.declare_index(by_n)
    ShardMover(store).rollback(shard)

    def declared_meanwhile() -> None:  # by a client that checked before the move began
        topo = store.cluster.current()
        store.cluster.create_index_tables(topo, by_n)
        store.cluster.create_fences(topo, topo.index_epoch + 1)
        assert store.cluster.catalog.record_index(by_n, "building", topo.index_epoch)
        store.cluster.retire_fences(store.cluster.refresh())

    failpoints.set("move.after_fence", declared_meanwhile)
    try:
        with pytest.raises(CatalogError, match="indexes changed"):
            ShardMover(store).move(shard, 1 - here)
    finally:
        failpoints.clear("move.after_fence")
    assert store.cluster.refresh().shard_servers[shard] == here  # rolled back
    ShardMover(store).move(shard, 1 - here)
    assert store.cluster.refresh().shard_servers[shard] == 1 - here
    moved = [e for e in entities if store.cluster.shard_of_id(e["id"]) == shard]
    store.put_many({**e, "n": e["n"] + 1000} for e in moved)  # every index table is there
    store.put({"id": new_id(), "user": 1, "n": 5})
    assert store.get_many(e["id"] for e in moved) == [{**e, "n": e["n"] + 1000} for e in moved]
