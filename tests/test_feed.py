"""The change feed against real servers: order, deletes, cursors, the held step 2,
snapshots with writes during them, moves, subscriptions and trimming."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import MySQLdb
import pytest
from conftest import same_store, shard_rows

from schemaless import (
    CatalogError,
    ConflictError,
    DataStore,
    Index,
    InvalidCursor,
    InvalidQuery,
    TableMissing,
    failpoints,
    new_id,
)
from schemaless.feed import ChangeEvent, ChangeFeed, FeedExpired, decode_cursor, encode_cursor
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import UNCHECKED, admin
from schemaless.subscriptions import feed_status
from schemaless.writes import BLIND, EntityWrite, entity_batch_sql

Make = Callable[..., DataStore]


def replay(
    events: Iterable[ChangeEvent], state: dict[bytes, Any] | None = None
) -> dict[bytes, Any]:
    """Apply events to a dict ``id -> (version, body or None)``, checking that each
    entity's versions only grow."""
    state = {} if state is None else state
    for e in events:
        if e.id in state:
            assert e.version > state[e.id][0], f"{e.id.hex()}: {e.version} after {state[e.id][0]}"
        state[e.id] = (e.version, None if e.entity is None else dict(e.entity))
    return state


def truth(store: DataStore, ids: Iterable[bytes]) -> dict[bytes, Any]:
    """The brute-force oracle: every id's stored version and body (None: deleted)."""
    out = {}
    for key in ids:
        got = store.get(key)
        out[key] = None if got is None else (got.version, dict(got))
    return out


def live(state: dict[bytes, Any]) -> dict[bytes, Any]:
    return {k: v for k, v in state.items() if v[1] is not None}


def test_events_in_order_with_deletes_and_cursors(make_store: Make) -> None:
    store = make_store(changes=True)
    ids = [new_id() for _ in range(20)]
    for i, key in enumerate(ids):
        store.put({"id": key, "n": i})
    for key in ids[:10]:
        store.update(key, lambda e: {**e, "n": e["n"] + 100})
    store.delete(ids[0])
    events = list(store.changes())
    assert len(events) == 31
    state = replay(events)
    assert state[ids[0]][1] is None
    assert state[ids[1]][1] == {"id": ids[1], "n": 101}
    assert live(state) == {k: v for k, v in truth(store, ids).items() if v is not None}
    # a cursor resumes after its event: the rest, nothing twice
    middle = events[15].cursor
    rest = list(store.changes(middle))
    seen = {(e.shard, e.seq) for e in events[:16]}
    assert {(e.shard, e.seq) for e in rest} <= {(e.shard, e.seq) for e in events} - seen | {
        (e.shard, e.seq) for e in events[16:]
    }
    assert {(e.shard, e.seq) for e in events[16:]} <= {(e.shard, e.seq) for e in rest} | seen
    assert list(store.changes(events[-1].cursor)) == []
    store.put({"id": ids[0], "n": -1})
    (again,) = list(store.changes(events[-1].cursor))
    assert again.id == ids[0] and again.entity == {"id": ids[0], "n": -1}


def test_change_rows_and_heads_carry_their_shard(make_store: Make) -> None:
    """The owned layout: each server's one ``changes`` table holds the rows of its
    logical shards, each naming its shard, numbered 1, 2, ... per shard; a head row
    per shard the server holds, at that shard's last number; events name the shard."""
    store = make_store(changes=True, shards=4)
    ids = [new_id() for _ in range(24)]
    store.put_many({"id": key} for key in ids)
    store.delete(ids[0])
    topo = store.cluster.refresh()
    db = topo.owned_db
    assert db is not None
    seen = 0
    for sid, server in store.cluster.all_servers(topo).items():
        changes, heads = server.run(
            admin(
                [
                    f"SELECT `shard`, `seq`, `id` FROM {quote(db, 'changes')}",
                    f"SELECT `shard`, `seq` FROM {quote(db, 'changes_head')} ORDER BY `shard`",
                ]
            )
        )
        assert [int(s) for s, _ in heads] == topo.shards_of(sid)
        for shard, head in heads:
            numbers = sorted(int(q) for s, q, _ in changes if s == shard)
            assert numbers == list(range(1, int(head) + 1))
        assert all(store.cluster.shard_of_id(bytes(key)) == s for s, _, key in changes)
        seen += len(changes)
    assert seen == 25
    events = list(store.changes())
    assert all(store.cluster.shard_of_id(e.id) == e.shard for e in events)
    assert len(events) == 25


def test_a_feed_read_of_a_shard_not_owned_fails(make_store: Make) -> None:
    """A server that no longer holds a logical shard (its ``owned`` row deleted, as a
    move's fence does) fails every feed read of that shard with ``TableMissing``:
    never an empty page taken for "caught up"."""
    store = make_store(changes=True, shards=4)
    key = new_id()
    store.put({"id": key})
    shard = store.cluster.shard_of_id(key)
    sub = store.subscribe("watcher")
    cursor = list(store.changes())[-1].cursor
    caught_up = ChangeFeed(store.reader, {}, range(4))
    assert len(list(caught_up.events())) == 1  # its shards are quiet: heads only now
    topo = store.cluster.refresh()
    server = store.cluster.server_of_shard(topo, shard)
    owned = quote(str(topo.owned_db), "owned")
    server.run(admin([f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {shard}"]))
    try:
        for read in (
            lambda: list(store.changes()),
            lambda: list(store.changes(cursor)),  # caught up there: nothing to read
            lambda: list(store.changes(snapshot=True)),
            lambda: list(caught_up.events()),
            lambda: list(sub.changes()),
            lambda: feed_status(store.cluster),
        ):
            with pytest.raises(TableMissing):
                read()
    finally:
        server.run(admin([f"INSERT INTO {owned} (`shard`) VALUES ({shard})"]))
    assert [e.id for e in store.changes()] == [key]


def test_a_round_reads_idle_shards_by_one_statement_of_heads(
    make_store: Make, local_cluster: Any
) -> None:
    """The owned layout: a shard read up to its head is read again only through one
    statement of heads per server; a change there shows in it and is read at once,
    within the same ``events()``."""
    store = make_store(changes=True, shards=8)
    sent: list[str] = []
    traced = same_store(local_cluster, store, tracer=lambda server, sql, seconds: sent.append(sql))
    store.put_many({"n": i} for i in range(16))
    feed = ChangeFeed(traced.reader, {}, range(8))
    assert len(list(feed.events())) == 16
    sent.clear()
    assert list(feed.events()) == []
    reads = [sql for sql in sent if "changes" in sql]
    assert len(reads) == 2  # a batch per server
    assert all("`changes_head` WHERE `shard` IN (" in sql for sql in reads)
    assert not any("`changes` " in sql or "`entities`" in sql for sql in reads)
    key = new_id()
    store.put({"id": key})
    assert [e.id for e in feed.events()] == [key]
    # a head row gone missing: its shard is read in full again, never left quiet
    topo = store.cluster.refresh()
    heads = quote(str(topo.owned_db), "changes_head")
    server = store.cluster.server_of_shard(topo, 0)
    (seq,) = server.run(admin([f"SELECT `seq` FROM {heads} WHERE `shard` = 0"]))[0][0]
    server.run(admin([f"DELETE FROM {heads} WHERE `shard` = 0"]))
    try:
        sent.clear()
        assert list(feed.events()) == []
        assert any("`changes` WHERE `shard` = 0 AND" in sql for sql in sent)
    finally:
        server.run(admin([f"INSERT INTO {heads} (`shard`, `seq`) VALUES (0, {int(seq)})"]))
    traced.close()


def test_the_feed_in_the_layout_of_a_database_per_shard(make_store: Make) -> None:
    """A datastore of the old layout keeps its feed: a head row per shard's database,
    events, cursors, snapshots and subscriptions."""
    store = make_store(changes=True, shards=4, layout="databases")
    topo = store.cluster.refresh()
    assert topo.owned_db is None
    ids = [new_id() for _ in range(12)]
    for i, key in enumerate(ids):
        store.put({"id": key, "n": i})
    store.update(ids[1], lambda e: {**e, "n": 100})
    store.delete(ids[0])
    events = list(store.changes())
    assert len(events) == 14
    state = replay(events)
    assert live(state) == {k: v for k, v in truth(store, ids).items() if v is not None}
    heads = [shard_rows(store, s, "changes_head", "`one`, `seq`") for s in range(4)]
    assert [h[0][1] for h in heads] == [sum(e.shard == s for e in events) for s in range(4)]
    snapshot = list(store.changes(snapshot=True))
    assert {e.id for e in snapshot if e.seq is None} == set(ids[1:])
    assert list(store.changes(events[-1].cursor)) == []
    sub = store.subscribe("old")
    sub.ack(list(sub.changes())[-1])
    assert [s["behind"] for s in feed_status(store.cluster)] == [0]


def test_feed_off_writes_nothing_extra(make_store: Make, local_cluster: Any) -> None:
    sent: list[str] = []
    store = make_store([Index(table="index_n", properties=["n"], shard_on="n")])
    traced = same_store(local_cluster, store, tracer=lambda server, sql, seconds: sent.append(sql))
    key = new_id()
    traced.put({"id": key, "n": 1})
    traced.update(key, lambda e: {**e, "n": 2})
    traced.delete(key)
    traced.close()
    assert sent and not any("changes" in sql or "feed" in sql for sql in sent)
    topo = store.cluster.refresh()
    assert not topo.changes
    for sid, server in store.cluster.all_servers(topo).items():
        dbs = [topo.dbs[s] for s in topo.shards_of(sid)]
        tables = server.run(
            "SELECT table_name FROM information_schema.tables WHERE table_schema IN ("
            + ", ".join(["%s"] * len(dbs))
            + ") AND table_name LIKE 'changes%%'",
            dbs,
        )[0]
        assert tables == ()
    with pytest.raises(CatalogError, match="change feed is off"):
        list(store.changes())


def test_a_held_step_2_holds_its_shard_back(make_store: Make, local_cluster: Any) -> None:
    """A step 2 held open after its change row is written: writes on other shards
    commit and are read; the held shard's later write waits for the head row, and the
    reader never moves past the held row."""
    store = make_store(changes=True, shards=4)
    topo = store.cluster.refresh()
    held_key = new_id()
    shard = store.cluster.shard_of_id(held_key)
    same = next(k for k in iter(new_id, None) if store.cluster.shard_of_id(k) == shard)
    other = next(k for k in iter(new_id, None) if store.cluster.shard_of_id(k) != shard)
    write = EntityWrite(
        topo.dbs[shard],
        shard,
        held_key,
        store.clock.next(),
        1,
        store.codec.encode({"id": held_key, "held": True}),
        BLIND,
        False,
    )
    sql, params, _ = entity_batch_sql([write], (), topo.dbs, topo.fence, True, topo.owned_db)
    assert sql.endswith("COMMIT") and "changes" in sql
    address = topo.servers[topo.shard_servers[shard]]
    conn = MySQLdb.connect(
        host=address.host,
        port=address.port,
        read_default_file=str(local_cluster.option_file),
        client_flag=MySQLdb.constants.CLIENT.MULTI_STATEMENTS,
    )
    conn.autocommit(True)
    cur = conn.cursor()
    cur.execute(sql[: -len("COMMIT")].rstrip().rstrip(";"), params)
    while cur.nextset():
        pass
    blocked = threading.Thread(target=lambda: store.put({"id": same, "after": True}))
    blocked.start()
    store.put({"id": other, "elsewhere": True})
    feed = ChangeFeed(store.reader, {}, range(4))
    first = list(feed.events())
    assert [e.id for e in first] == [other]
    assert blocked.is_alive()  # waits for the head row of the held shard
    cur.execute("COMMIT")
    blocked.join(10)
    assert not blocked.is_alive()
    later = list(feed.events())
    assert [e.id for e in later] == [held_key, same]
    assert [e.seq for e in later] == [1, 2]
    conn.close()


@pytest.mark.parametrize("point", ["put.before_index_rows", "put.after_index_rows"])
def test_failed_before_step_2_emits_nothing(make_store: Make, point: str) -> None:
    store = make_store([Index(table="index_n", properties=["n"], shard_on="n")], changes=True)
    failpoints.set(point, "raise")
    with pytest.raises(failpoints.FailpointError):
        store.put({"id": new_id(), "n": 1})
    assert list(store.changes()) == []


def test_a_delete_failed_before_step_2_emits_nothing(make_store: Make) -> None:
    store = make_store(changes=True)
    key = new_id()
    store.put({"id": key})
    start = list(store.changes())[-1].cursor
    failpoints.set("delete.before_entity", "raise")
    with pytest.raises(failpoints.FailpointError):
        store.delete(key)
    assert list(store.changes(start)) == []


@pytest.mark.parametrize("point", ["put.after_entity", "put.after_stale_rows"])
def test_failed_after_step_2_is_in_the_feed(make_store: Make, point: str) -> None:
    store = make_store([Index(table="index_n", properties=["n"], shard_on="n")], changes=True)
    key = new_id()
    store.put({"id": key, "n": 0})
    failpoints.set(point, "raise")
    with pytest.raises(failpoints.FailpointError):
        store.put({"id": key, "n": 1})
    failpoints.set("delete.after_entity", "raise")
    with pytest.raises(failpoints.FailpointError):
        store.delete(key)
    events = list(store.changes())
    assert [(e.id, e.deleted) for e in events] == [(key, False), (key, False), (key, True)]
    assert events[1].entity == {"id": key, "n": 1}


def test_random_operations_against_the_oracle(make_store: Make, local_cluster: Any) -> None:
    """Random puts, compare-and-sets, updates and deletes from two clients, read by a
    consumer that resumes from cursors at random: its state equals the stored one."""
    store = make_store(changes=True)
    other = same_store(local_cluster, store)
    rng = random.Random(7)
    ids = [new_id() for _ in range(30)]
    state: dict[bytes, Any] = {}
    cursor = None
    for _ in range(8):
        for _ in range(40):
            key = rng.choice(ids)
            op = rng.random()
            if op < 0.5:
                other.put({"id": key, "n": rng.randrange(1000)})
            elif op < 0.8:
                got = store.get(key)
                if got is not None:
                    store.put({**got, "n": -got["n"]}, expect_version=got.version)
            else:
                store.delete(key)
        events = list(store.changes(cursor))
        replay(events, state)
        if events:
            cursor = events[-1].cursor
        assert {k: v for k, v in truth(store, ids).items() if v is not None} == live(state)
    final = replay(store.changes())
    stored = truth(store, ids)
    assert {k: v for k, v in stored.items() if v is not None} == live(final)
    assert all(final[k][1] is None for k, v in stored.items() if v is None and k in final)
    other.close()


def test_cursors_are_checked() -> None:
    assert decode_cursor(encode_cursor({0: 5, 3: (7, 9), 2: (None, 0)}), 4) == {
        0: 5,
        3: (7, 9),
        2: (None, 0),
    }
    assert encode_cursor({0: 0}) == encode_cursor({})
    for bad in ("", "c1.!!", "x" * 10, encode_cursor({9: 1}), 5):
        with pytest.raises(InvalidCursor):  # a query's, an edge page's, a timeline's too
            decode_cursor(bad, 4)
    with pytest.raises(InvalidCursor) as refused:  # no zlib's text in the message
        decode_cursor("c1.AAAA", 4)
    assert str(refused.value) == "not a change feed cursor: 'c1.AAAA'"


def test_snapshot_then_follow_with_writes_during_the_snapshot(make_store: Make) -> None:
    """Entities are put, changed and deleted while a snapshot reads them page by page:
    the consumer ends with exactly the stored entities, every entity's versions grow."""
    store = make_store(changes=True, shards=4)
    rng = random.Random(3)
    ids = [new_id() for _ in range(120)]
    for i, key in enumerate(ids[:80]):
        store.put({"id": key, "n": i})
    feed = ChangeFeed(store.reader, {s: (None, 0) for s in range(4)}, range(4), batch=7)
    state: dict[bytes, Any] = {}
    snapshot_ids = set()
    for n, event in enumerate(feed.events()):
        replay([event], state)
        if event.seq is None:
            snapshot_ids.add(event.id)
        if n % 3 == 0:  # writes between pages: updates, deletes, new entities
            key = rng.choice(ids)
            if rng.random() < 0.25:
                store.delete(key)
            else:
                store.put({"id": key, "n": rng.randrange(1000)})
    replay(feed.events(), state)
    stored = truth(store, ids)
    assert live(state) == {k: v for k, v in stored.items() if v is not None}
    assert snapshot_ids  # some entities came from the snapshot, the rest as changes
    assert all(isinstance(p, int) for p in feed.positions.values())


def test_a_snapshot_cursor_resumes_the_snapshot(make_store: Make) -> None:
    store = make_store(changes=True, shards=2)
    ids = [new_id() for _ in range(30)]
    for key in ids:
        store.put({"id": key})
    feed = ChangeFeed(store.reader, {0: (None, 0), 1: (None, 0)}, range(2), batch=4)
    first = []
    for event in feed.events():
        first.append(event)
        if len(first) == 10:
            break
    assert all(e.seq is None for e in first)
    rest = list(store.changes(first[-1].cursor))
    assert {e.id for e in first} | {e.id for e in rest} == set(ids)
    assert not {e.id for e in first} & {e.id for e in rest}


def test_a_move_emits_nothing_and_cursors_stay_valid(make_store: Make, local_cluster: Any) -> None:
    store = make_store(changes=True, shards=4)
    ids = [new_id() for _ in range(40)]
    for key in ids:
        store.put({"id": key, "n": 1})
    before = list(store.changes())
    stale = DataStore(  # a reader caught up before the move, its map not refreshed since
        local_cluster.addresses,
        option_file=str(local_cluster.option_file),
        prefix=store.cluster.topology.prefix,
        create=False,
        refresh_interval=600,
    )
    follower = ChangeFeed(stale.reader, {}, range(4))
    assert len(list(follower.events())) == 40
    topo = store.cluster.refresh()
    shard = store.cluster.shard_of_id(ids[0])
    target = 1 - topo.shard_servers[shard]
    ShardMover(store).move(shard, target)
    assert store.cluster.refresh().shard_servers[shard] == target
    assert list(store.changes(before[-1].cursor)) == []  # the copy emitted nothing
    last = max(e.seq or 0 for e in before if e.shard == shard)
    assert shard_rows(store, shard, "changes_head", "`seq`") == [(last,)]  # came with it
    store.put({"id": ids[0], "n": 2})
    (after,) = list(store.changes(before[-1].cursor))
    assert after.id == ids[0] and after.shard == shard
    assert after.seq == last + 1
    assert [(e.id, e.seq) for e in follower.events()] == [(ids[0], last + 1)]
    assert stale.cluster.topology.shard_servers[shard] == target  # it followed the map
    stale.close()


def test_subscriptions_resume_and_the_cleaner_trims(make_store: Make, local_cluster: Any) -> None:
    from schemaless.cleaner.daemon import Cleaner
    from schemaless.subscriptions import feed_status

    store = make_store(changes=True, shards=2)
    ids = [new_id() for _ in range(10)]
    for key in ids:
        store.put({"id": key})
    sub = store.subscribe("indexer")
    events = list(sub.changes())
    assert len(events) == 10
    sub.ack(events[4])
    status = {s["name"]: s for s in feed_status(store.cluster)}
    assert status["indexer"]["behind"] == 5
    again = same_store(local_cluster, store).subscribe("indexer")  # a restarted consumer
    assert {e.id for e in again.changes()} == {e.id for e in events[5:]}
    cleaner = Cleaner(store)
    cleaner.run_once()
    kept = count_changes(store)
    assert 5 <= kept < 10  # the acknowledged rows are gone, the others kept
    with pytest.raises(FeedExpired):
        list(store.changes(encode_cursor({0: 1, 1: 1})))
    sub.ack(events[-1])
    cleaner.run_once()
    assert count_changes(store) == 0
    assert list(sub.changes()) == []
    store.put({"id": ids[0], "n": 1})
    assert [e.id for e in sub.changes()] == [ids[0]]


def count_changes(store: DataStore) -> int:
    topo = store.cluster.refresh()
    return sum(int(shard_rows(store, s, "changes", "COUNT(*)")[0][0]) for s in range(topo.n_shards))


def test_a_version_guarded_delete_is_a_delete_and_a_lost_one_emits_nothing(
    make_store: Make,
) -> None:
    """The expiry purge deletes with ``expect_version`` (the version it saw expired):
    the feed reports it as a delete; when a re-put won meanwhile, nothing."""
    store = make_store(changes=True)
    gone, kept = new_id(), new_id()
    v_gone = store.put({"id": gone, "ttl": 1})
    v_kept = store.put({"id": kept, "ttl": 1})
    start = list(store.changes())[-1].cursor
    store.delete(gone, expect_version=v_gone)
    store.put({"id": kept, "ttl": 2})  # re-put before the purge
    with pytest.raises(ConflictError):
        store.delete(kept, expect_version=v_kept)
    events = [(e.id, e.deleted) for e in store.changes(start)]
    assert sorted(events) == sorted([(gone, True), (kept, False)])


def test_parts_split_the_shards_between_consumers(make_store: Make) -> None:
    store = make_store(changes=True, shards=8)
    ids = [new_id() for _ in range(40)]
    store.put_many({"id": key} for key in ids)
    halves = [list(store.changes(part=(k, 3))) for k in range(3)]
    for k, events in enumerate(halves):
        assert events and {e.shard % 3 for e in events} == {k}
    assert sorted(e.id for events in halves for e in events) == sorted(ids)
    subs = [store.subscribe("split", part=(k, 2)) for k in range(2)]
    for sub in subs:
        for event in sub.changes():
            sub.ack(event)
    fresh = [store.subscribe("split", part=(k, 2)) for k in range(2)]
    assert all(list(sub.changes()) == [] for sub in fresh)
    with pytest.raises(InvalidQuery):
        list(store.changes(part=(2, 2)))


def test_turning_the_feed_on_fences_writers_with_an_old_map(
    make_store: Make, local_cluster: Any
) -> None:
    """A client that has not refreshed its map since the feed was turned on writes its
    next body with a change row anyway: its write meets the dropped fence, refreshes."""
    store = make_store(shards=4)
    old = DataStore(
        local_cluster.addresses,
        option_file=str(local_cluster.option_file),
        prefix=store.cluster.topology.prefix,
        create=False,
        refresh_interval=600,
    )
    key = new_id()
    old.put({"id": key, "n": 0})
    assert not old.cluster.topology.changes
    enable = DataStore(
        local_cluster.addresses,
        option_file=str(local_cluster.option_file),
        prefix=store.cluster.topology.prefix,
        create=False,
        changes=True,
    )
    old.put({"id": key, "n": 1})  # with the map from before the feed
    assert old.cluster.topology.changes
    events = list(enable.changes())
    assert [(e.id, e.entity) for e in events] == [(key, {"id": key, "n": 1})]
    for ds in (old, enable):
        ds.close()


def test_turning_the_feed_on_never_makes_a_fenced_shard_owned_again(
    make_store: Make, local_cluster: Any
) -> None:
    """The owned layout: turning the feed on gives a head row to each shard a server
    holds (its ``owned`` rows), not to the map's: a shard whose ``owned`` row a move's
    fence deleted stays given away (no row of it, no head), the others get heads."""
    store = make_store(shards=4)
    topo = store.cluster.refresh()
    db = str(topo.owned_db)
    server = store.cluster.server_of_shard(topo, 1)
    server.run(admin([f"{UNCHECKED}DELETE FROM {quote(db, 'owned')} WHERE `shard` = 1"]))
    try:
        DataStore(
            local_cluster.addresses,
            option_file=str(local_cluster.option_file),
            prefix=topo.prefix,
            create=False,
            changes=True,
        ).close()
        owned, heads = server.run(
            admin(
                [
                    f"SELECT `shard` FROM {quote(db, 'owned')} ORDER BY `shard`",
                    f"SELECT `shard`, `seq` FROM {quote(db, 'changes_head')} ORDER BY `shard`",
                ]
            )
        )
    finally:
        server.run(admin([f"INSERT IGNORE INTO {quote(db, 'owned')} (`shard`) VALUES (1)"]))
    held = [s for s in topo.shards_of(topo.shard_servers[1]) if s != 1]
    assert [int(s) for (s,) in owned] == held
    assert [(int(s), int(q)) for s, q in heads] == [(s, 0) for s in held]


def test_the_cleaner_trims_by_age_without_subscriptions(make_store: Make) -> None:
    from schemaless.cleaner.daemon import Cleaner

    store = make_store(changes=True, shards=2)
    store.put_many({"n": i} for i in range(5))
    events = list(store.changes())
    Cleaner(store).run_once()  # 7 days: nothing is that old
    assert count_changes(store) == 5
    figures = Cleaner(store, feed_retention=0).run_once(now=time.time() + 1)
    assert figures["feed_trimmed"] == 5 and count_changes(store) == 0
    busy = max((0, 1), key=lambda s: sum(e.shard == s for e in events))  # 3 rows or more
    with pytest.raises(FeedExpired):  # rows after position 1 were trimmed
        list(store.changes(encode_cursor({busy: 1})))
    assert list(store.changes()) == []  # from the oldest kept: nothing
    store.put({"n": 9})
    assert [e.entity["n"] for e in store.changes() if e.entity] == [9]


def test_a_hole_inside_a_batch_is_reported_never_skipped(make_store: Make) -> None:
    """A shard's numbers have no holes but a trimmed prefix: a change row missing from
    the middle (which no trim, move or rollback leaves) fails the read with its
    range, instead of a cursor moved past it."""
    store = make_store(changes=True, shards=1)
    store.put_many({"n": i} for i in range(5))
    assert [e.seq for e in store.changes()] == [1, 2, 3, 4, 5]
    topo = store.cluster.refresh()
    db = topo.owned_db or topo.dbs[0]
    server = store.cluster.server_of_shard(topo, 0)
    server.run(f"/*schemaless:admin*/ DELETE FROM `{db}`.`changes` WHERE `seq` IN (3, 4)")
    with pytest.raises(FeedExpired, match="changes 3 to 4 are missing"):
        list(store.changes())
    with pytest.raises(FeedExpired, match="changes 3 to 4 are missing"):
        list(store.changes(encode_cursor({0: 1})))
    assert [e.seq for e in store.changes(encode_cursor({0: 4}))] == [5]


def test_step_2_sql_with_the_feed() -> None:
    """Heads locked first, in shard order, before any entity row; change rows after
    every write; the first write's count offset includes the heads."""
    dbs = ("p_0000", "p_0001")
    writes = [
        EntityWrite(dbs[1], 1, b"\x02" * 16, 7, 1, b"b", BLIND, False),
        EntityWrite(dbs[0], 0, b"\x01" * 16, 7, 1, None, BLIND, False),
        EntityWrite(dbs[1], 1, b"\x00" * 16, 7, 1, b"a", BLIND, False),
    ]
    plain, plain_params, plain_first = entity_batch_sql(writes, (), dbs)
    sql, params, first = entity_batch_sql(writes, (), dbs, None, True)
    stmts = sql.split(";\n")
    assert stmts[0] == "START TRANSACTION" and stmts[-1] == "COMMIT"
    assert stmts[1] == "SET @schemaless_feed0 = NULL, @schemaless_feed1 = NULL"
    assert "`p_0000`.`changes_head`" in stmts[2] and stmts[2].endswith("FOR UPDATE")
    assert "`p_0001`.`changes_head`" in stmts[3]
    assert first == plain_first + 3 and stmts[first : first + 3] == plain.split(";\n")[1:-1]
    inserts = stmts[first + 3 : first + 6]
    assert all(s.startswith("INSERT INTO") and "`changes`" in s for s in inserts)
    assert "@schemaless_feed0 := @schemaless_feed0 + 1" in inserts[0]
    assert stmts[first + 6].startswith("UPDATE `p_0000`.`changes_head`")
    assert params[: len(plain_params)] == plain_params
    ordered = sorted(writes, key=lambda w: (w.db, w.entity_id))
    assert params[len(plain_params) :] == [x for w in ordered for x in (w.entity_id, w.version)]


def test_step_2_sql_with_the_feed_in_the_owned_layout() -> None:
    """The owned layout: one head row per shard in the data database's
    ``changes_head``, locked in shard order before any entity row; change rows carry
    their shard (copied from the entity row); the check first, its rows locked."""
    dbs = ("p_data", "p_data")
    writes = [
        EntityWrite(dbs[1], 1, b"\x02" * 16, 7, 1, b"b", BLIND, False),
        EntityWrite(dbs[0], 0, b"\x01" * 16, 7, 1, None, BLIND, False),
    ]
    sql, _, first = entity_batch_sql(writes, (), dbs, None, True, "p_data")
    stmts = sql.split(";\n")
    assert "/*schemaless:owned*/" in stmts[1] and "IN (0, 1) LOCK IN SHARE MODE) < 2" in stmts[1]
    assert stmts[3] == (
        "SELECT `seq` INTO @schemaless_feed0 FROM `p_data`.`changes_head`"
        " WHERE `shard` = 0 FOR UPDATE"
    )
    assert stmts[4].endswith("WHERE `shard` = 1 FOR UPDATE") and first == 5
    inserts = stmts[first + 2 : first + 4]
    assert all(
        s.startswith("INSERT INTO `p_data`.`changes` (`shard`, `seq`,")
        and " SELECT `shard`, @schemaless_feed" in s
        for s in inserts
    )
    assert stmts[first + 4] == (
        "UPDATE `p_data`.`changes_head` SET `seq` = @schemaless_feed0 WHERE `shard` = 0"
    )
    assert stmts[-1] == "COMMIT"


def test_subscription_positions_round_trip() -> None:
    from schemaless.feed import part_shards
    from schemaless.subscriptions import _loaded, _stored

    for position in (0, 5, (None, 0), (9, 0), (9, 42), (0, 3)):
        assert _loaded(*_stored(position)) == position
    assert part_shards(5, None) == [0, 1, 2, 3, 4]
    assert part_shards(5, (1, 2)) == [1, 3]
    for bad in ((2, 2), (-1, 2), (0, 0), ("0", 1)):
        with pytest.raises(InvalidQuery):
            part_shards(5, bad)  # type: ignore[arg-type]
