"""Edges with counts (schemaless.edges) on real servers: one round trip per side,
idempotent, exact counts, keyset pages, the inverse a superset repaired after a cut."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from conftest import shard_rows, wait_until
from test_cli import Cli, cluster_env
from test_edges_together import node_near

from schemaless import DataStore, Edges, Feeds, TableMissing, new_id
from schemaless import failpoints as fp
from schemaless.edges import _write_sql, missing_tables
from schemaless.edgetables import table_names
from schemaless.errors import CatalogError, InvalidCursor, InvalidEntity, InvalidId, InvalidQuery
from schemaless.failpoints import FailpointError
from schemaless.local import LocalCluster
from schemaless.names import quote
from schemaless.owned import CHECK, TRIGGERED, UNCHECKED, admin, copying
from schemaless.wire import read_results


@pytest.fixture
def ds(make_store: Callable[..., DataStore]) -> DataStore:
    return make_store()


def test_add_remove_count_idempotent_in_one_round_trip(ds: DataStore) -> None:
    likes = Edges(ds, "likes", inverse="liked_by")
    user, other = new_id(), new_id()
    entry = node_near(ds, user, together=False)  # one server's: one batch (test_edges_together)
    sent: list[str] = []
    for server in ds.cluster.servers():
        server.tracer = lambda name, sql, s: sent.append(sql)
    assert likes.add(user, entry) is True
    sent = [sql for sql in sent if "edges__" in sql]  # not the catalog's refreshes
    assert len(sent) == 2  # the inverse, then the edge: one statement each
    assert "edges__liked_by" in sent[0] and "edges__likes" in sent[1]
    assert sent[0].startswith(f"{TRIGGERED} INSERT INTO") and ";" not in sent[0]
    assert CHECK not in sent[0]  # its upsert fires the guard's triggers
    likes.add(user, other, data={"stars": 5})
    likes.add(new_id(), entry)
    assert (likes.count(user), likes.count_inverse(entry), likes.count_inverse(other)) == (2, 2, 1)
    assert likes.has(user, entry) and not likes.has(entry, user)
    assert likes.remove(user, entry) is True
    assert likes.remove(user, entry) is False
    assert likes.remove(new_id(), new_id()) is False
    assert (likes.count(user), likes.count_inverse(entry)) == (1, 1)
    assert not likes.has(user, entry)
    assert [e.data for e in likes.page(user)] == [{"stars": 5}]
    assert likes.count(new_id()) == 0


def test_pages_newest_first_with_a_keyset_cursor(ds: DataStore) -> None:
    follows = Edges(ds, "follows", inverse="followed_by")
    me = new_id()
    them = [new_id() for _ in range(7)]
    for t in them:
        follows.add(me, t)
        follows.add(t, me)
    got, cursor, pages = [], None, 0
    while True:
        page = follows.page(me, limit=3, cursor=cursor)
        got += [e.dst for e in page]
        pages += 1
        cursor = page.cursor
        if cursor is None:
            break
    assert got == them[::-1] and pages == 3
    back = follows.page_inverse(me, limit=7)
    assert [e.src for e in back] == them[::-1] and back.cursor is None
    assert all(e.dst == me for e in back)
    chunks = list(follows.sources(me, chunk=3))
    assert [len(c) for c in chunks] == [3, 3, 1]
    assert [s for c in chunks for s in c] == them[::-1]
    with pytest.raises(InvalidQuery, match="another node"):
        follows.page(them[0], cursor=follows.page(me, limit=1).cursor)
    with pytest.raises(InvalidQuery, match="another node"):
        follows.page_inverse(me, cursor=follows.page(me, limit=1).cursor)


def test_bad_input_is_refused_and_writes_nothing(ds: DataStore) -> None:
    with pytest.raises(InvalidQuery, match="invalid edge type"):
        Edges(ds, "Likes; DROP")
    with pytest.raises(InvalidQuery, match="invalid edge type"):
        Edges(ds, "a__n")
    with pytest.raises(InvalidQuery, match="own inverse"):
        Edges(ds, "likes", inverse="likes")
    likes = Edges(ds, "likes")
    user = new_id()
    with pytest.raises(InvalidId):
        likes.add(user, "not an id")
    with pytest.raises(InvalidEntity, match="msgpack"):
        likes.add(user, new_id(), data={"x": object()})
    with pytest.raises(InvalidEntity, match="at most"):
        likes.add(user, new_id(), data=b"x" * 70000)
    for limit in (0, 1001, "5", True):
        with pytest.raises(InvalidQuery, match="limit"):
            likes.page(user, limit=limit)  # type: ignore[arg-type]
    for cursor in ("nope", "ec1.!!!", "ec1.kw", "ec1.AAAA"):  # AAAA: msgpack's "extra data"
        with pytest.raises(InvalidCursor, match=f"not an edge page cursor: '{re.escape(cursor)}'"):
            likes.page(user, cursor=cursor)
    with pytest.raises(InvalidQuery, match="no inverse"):
        likes.count_inverse(user)
    assert likes.count(user) == 0 and likes.page(user) == []


def _has_tables(ds: DataStore, kind: str) -> bool:
    return not missing_tables(ds, list(table_names(kind)))


def test_an_inverse_is_recorded_with_the_tables_and_kept(ds: DataStore) -> None:
    """A type made with an inverse keeps it: opened without one it still writes both
    sides; another inverse, a write through the inverse, or an inverse type taken for
    another pair is refused, nothing written."""
    Edges(ds, "likes", inverse="liked_by").add(new_id(), entry := new_id())
    plain = Edges(ds, "likes")  # as a reader of the code would forget the inverse
    assert plain.inverse == "liked_by" and plain.add(new_id(), entry)
    assert plain.count_inverse(entry) == 2
    with pytest.raises(InvalidQuery, match="made with the inverse 'liked_by', not 'liked_bz'"):
        Edges(ds, "likes", inverse="liked_bz")
    back = Edges(ds, "liked_by")  # reads the inverse side; writes go through likes
    assert back.count(entry) == 2 and back.inverse is None
    with pytest.raises(InvalidQuery, match="is the inverse of 'likes': add and remove through"):
        back.add(entry, new_id())
    with pytest.raises(InvalidQuery, match="is the inverse of 'likes'"):
        back.remove(entry, new_id())
    with pytest.raises(InvalidQuery, match="own: add and remove through edge type 'likes'"):
        Edges(ds, "liked_by", inverse="likes")
    with pytest.raises(InvalidQuery, match="'liked_by' is the inverse of 'likes': it cannot"):
        Edges(ds, "loves", inverse="liked_by")
    with pytest.raises(InvalidQuery, match="'likes' is made with the inverse 'liked_by'"):
        Edges(ds, "fans", inverse="likes")
    assert back.count(entry) == 2 and plain.count_inverse(entry) == 2
    assert not _has_tables(ds, "liked_bz") and not _has_tables(ds, "loves")


def test_tables_made_before_pairings_take_the_callers_until_edges_create(
    ds: DataStore,
) -> None:
    Edges(ds, "follows", inverse="followers")
    topo = ds.cluster.current()
    for server in ds.cluster.servers():  # as an earlier build made them: no comment
        for kind in ("follows", "followers"):
            table = quote(str(topo.owned_db), table_names(kind)[0])
            server.run(admin([f"ALTER TABLE {table} COMMENT = ''"]))
    assert Edges(ds, "follows").inverse is None  # the caller's, as before
    Edges(ds, "followers").add(new_id(), new_id())  # not known as an inverse yet
    Edges(ds, "follows", inverse="followers", create=False).create()  # `edges create`
    assert Edges(ds, "follows").inverse == "followers"
    with pytest.raises(InvalidQuery, match="is the inverse of 'follows'"):
        Edges(ds, "followers").add(new_id(), new_id())


def test_the_old_layout_is_told_the_way_over(make_store: Callable[..., DataStore]) -> None:
    old = make_store(layout="databases")
    with pytest.raises(CatalogError, match=r"dump.*restore"):
        Edges(old, "likes")
    with pytest.raises(CatalogError, match=r"dump.*restore"):
        Feeds(old, "home")
    assert not old.cluster.refresh().changes  # refused before turning the feed on


def test_a_cut_between_the_sides_leaves_the_inverse_a_superset_that_repair_clears(
    ds: DataStore,
) -> None:
    follows = Edges(ds, "follows", inverse="followers")
    a = new_id()  # b's and c's shards on another server: two round trips, cut between
    b, c = node_near(ds, a, together=False), node_near(ds, a, together=False)
    follows.add(a, c)
    fp.set("edges.between_sides", "raise")
    with pytest.raises(FailpointError):
        follows.add(a, b)  # the inverse written, the edge not
    assert [e.src for e in follows.page_inverse(b)] == [a] and not follows.has(a, b)
    with pytest.raises(FailpointError):
        follows.remove(a, c)  # the edge removed, the inverse not
    fp.clear()
    assert not follows.has(a, c) and follows.count_inverse(c) == 1
    assert follows.repair() == 0  # within the grace: may be an add in flight
    assert follows.repair(grace=0) == 2
    assert (follows.count_inverse(b), follows.count_inverse(c), follows.count(a)) == (0, 0, 0)
    follows.add(a, b)  # a retried add completes both sides
    assert follows.has(a, b) and follows.count_inverse(b) == 1
    assert follows.repair(grace=0) == 0 and follows.count_inverse(b) == 1


def test_a_side_sent_to_a_server_without_its_shard_commits_nothing(ds: DataStore) -> None:
    """``add`` and ``remove`` carry no ownership check: each side's upserts fire the
    guard's insert trigger, so on a server that does not own the shard (a stale map's)
    the whole batch fails, a remove's delete of a row left there with it; a move's
    copy there is not counted by the count trigger."""
    Edges(ds, "likes")
    topo = ds.cluster.topology
    db, src, dst = topo.owned_db, new_id(), new_id()
    assert db is not None
    shard = ds.cluster.shard_of_id(src)
    wrong = next(
        server
        for sid, server in ds.cluster.all_servers(topo).items()
        if sid != topo.shard_servers[shard]
    )
    edges, counts = (quote(db, t) for t in table_names("likes"))
    left = f"INSERT INTO {edges} VALUES ({shard}, %s, %s, 1, 1, NULL)"  # a move's copy
    wrong.run(admin(copying(shard, [left])), [src, dst])
    writes = (
        ("add", (src, new_id(), 2, 2, None)),
        ("add_counting", (src, new_id(), 2, 2, None, src)),
        ("remove", (src, dst, src)),
    )
    for op, params in writes:
        with pytest.raises(TableMissing, match="not on this server"):
            wrong.run(_write_sql(db, "likes", op, shard), params, commits=True)
    where = f"WHERE `shard` = {shard}"
    read = [f"SELECT `dst` FROM {edges} {where}", f"SELECT COUNT(*) FROM {counts} {where}"]
    assert wrong.run(admin(read)) == [((dst,),), ((0,),)]


def test_a_fenced_shard_refuses_every_write_on_the_edge_and_count_tables(
    ds: DataStore,
) -> None:
    """An edge table has the guard key and the update trigger, a count table only the
    insert trigger (its writes are upserts, or the count trigger's update under the
    edge's key): with the node's ``owned`` row gone (a move's fence), an add of a
    present edge (the upsert's update), of a new edge (the count row present: its
    update) and a remove are refused on both types' tables, nothing changes, and the
    counts stay exact once the shard is back."""
    likes = Edges(ds, "likes", inverse="liked_by")
    user, entry = new_id(), new_id()
    likes.add(user, entry)
    topo = ds.cluster.current()
    db = str(topo.owned_db)
    kinds = {"likes": (user, entry), "liked_by": (entry, user)}
    triggers = ds.cluster.server_of_shard(topo, 0).run(
        admin(
            ["SELECT `trigger_name` FROM information_schema.triggers WHERE `trigger_schema` = %s"]
        ),
        [db],
    )[0]
    names = {str(t[0]) for t in triggers}
    for kind in kinds:
        edges, counts = table_names(kind)
        assert {f"{edges}_gu", f"{counts}_gi"} <= names
        assert not {f"{edges}_gi", f"{counts}_gu"} & names
    for kind, (src, dst) in kinds.items():
        shard = ds.cluster.shard_of_id(src)
        server = ds.cluster.server_of_shard(topo, shard)
        owned = quote(db, "owned")
        writes = (
            ("add", (src, dst, 2, 2, None)),
            ("add", (src, new_id(), 2, 2, None)),
            ("add_counting", (src, dst, 2, 2, None, src)),
            ("remove", (src, dst, src)),
        )
        server.run(admin([f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {shard}"]))
        try:
            for op, params in writes:
                with pytest.raises(TableMissing, match="not on this server"):
                    server.run(_write_sql(db, kind, op, shard), params, commits=True)
        finally:
            server.run(admin([f"INSERT INTO {owned} (`shard`) VALUES ({shard})"]))
        edges, counts = (quote(db, t) for t in table_names(kind))
        where = f"WHERE `shard` = {shard} AND `src` = %s"
        rows = server.run(admin([f"SELECT `dst`, `touched` FROM {edges} {where}"]), [src])[0]
        assert [r[0] for r in rows] == [dst] and rows[0][1] != 2  # not touched either
    assert (likes.count(user), likes.count_inverse(entry)) == (1, 1)
    assert likes.add(user, entry) is False and likes.add(user, new_id()) is True
    assert likes.remove(user, entry) is True
    assert (likes.count(user), likes.count_inverse(entry)) == (1, 0)


def test_counts_stay_exact_under_concurrent_adds_of_a_hot_node(ds: DataStore) -> None:
    likes = Edges(ds, "likes", inverse="liked_by")
    entry = new_id()
    users = [new_id() for _ in range(40)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda u: likes.add(u, entry), users + users))
        list(pool.map(lambda u: likes.remove(u, entry), users[:10] * 2))
    assert likes.count_inverse(entry) == 30
    assert likes.counts_inverse([entry, users[0], entry]) == {entry: 30, users[0]: 0}
    shard = ds.cluster.shard_of_id(entry)
    rows = shard_rows(ds, shard, "edges__liked_by", "COUNT(*)", "`src` = %s", (entry,))
    assert rows[0][0] == 30


def test_a_server_without_the_tables_gets_them_on_first_use(ds: DataStore) -> None:
    likes = Edges(ds, "likes")
    db = ds.cluster.topology.owned_db
    assert db is not None
    for server in ds.cluster.servers():
        server.run(f"/*schemaless:admin*/ DROP TABLE `{db}`.`edges__likes`")
    assert likes.add(new_id(), new_id()) is True


def test_cli_counts_and_pages(ds: DataStore, local_cluster: LocalCluster) -> None:
    likes = Edges(ds, "likes", inverse="liked_by")
    user, entry = new_id(), new_id()
    likes.add(user, entry, data={"n": 1})
    run = Cli(cluster_env(local_cluster, ds.cluster.topology.prefix))
    assert run.ok("edges", "count", "likes", user.hex()).output.strip() == "1"
    out = run.ok("edges", "page", "liked_by", entry.hex()).output
    assert user.hex() in out
    (edge,) = likes.page(user)
    when = datetime.fromtimestamp(edge.at / 1e6, tz=UTC)
    assert "at (UTC)" in out and when.strftime("%Y-%m-%d %H:%M:%S.%f") in out, out
    out = run.ok("edges", "page", "likes", user.hex(), "--json").output
    assert json.loads(out.splitlines()[0])["dst"] == entry.hex()
    assert json.loads(out.splitlines()[0])["at"] == edge.at  # µs in JSON
    assert "invalid edge type" in run.fails("edges", "count", "Bad!", user.hex())
    assert "unknown edge type 'likez'" in run.fails("edges", "page", "likez", user.hex())
    with pytest.raises(InvalidQuery, match="unknown edge type"):
        Edges(ds, "likez", create=False).count(user)
    assert "ID" in run.fails("edges", "count", "likes", "xyz")
    repair = ("edges", "repair", "likes", "--inverse", "liked_bz")  # was "missing table"
    assert "edge type 'likes' was made with the inverse 'liked_by', not 'liked_bz'" in run.fails(
        *repair
    )
    assert "0 orphaned" in run.ok("edges", "repair", "likes", "--inverse", "liked_by").output
    for bad in ("nan", "inf", "-1"):  # nan and inf were tracebacks, -1 a grace of 0
        assert "'--grace'" in run.fails(*repair[:-1], "liked_by", "--grace", bad)
    for bad in ("0", "1001"):  # the option named, as every page size of the CLI
        assert "'--limit'" in run.fails("edges", "page", "likes", user.hex(), "--limit", bad)
    other = run.fails("edges", "page", "likes", entry.hex(), "--cursor", "ec1.AAAA")
    assert other.startswith("Error: Invalid value for '--cursor': not an edge page cursor"), other


def test_the_hot_node_bench_counts_exactly_through_its_delay_proxy(
    local_cluster: LocalCluster,
) -> None:
    """``bench.hotnode`` at a tiny size: both sides like through the delay proxy (the
    bench asserts the hot counts exact), and the proxy's 1 ms each way shows."""
    from bench.env import Servers
    from bench.harness import drop_prefix
    from bench.hotnode import hot_node

    servers = Servers(tuple(local_cluster.addresses), str(local_cluster.option_file))
    prefix = "hot" + new_id().hex()[:8]
    try:
        pids = [int(s["pid"]) for s in local_cluster.status() if s["pid"] is not None]
        got = hot_node(
            servers, prefix, threads=2, seconds=0.8, delay_ms=1.0, rounds=1, server_pids=pids
        )
    finally:
        drop_prefix(servers, prefix)
    assert got["naive"]["exact"] and got["Edges.add"]["exact"]
    assert min(got[side]["ops"] for side in ("naive", "Edges.add")) > 0
    # a naive like is eight round trips of at least 2 ms through the proxy
    assert got["naive"]["per_s"] < 2 / 0.016
    for side in ("naive", "Edges.add"):  # the CPU a like of the client and the servers
        cpu = got[side]["cpu_ms"]
        assert cpu["client"] > 0 and cpu["servers"] > 0


def test_reads_of_a_fenced_shard_fail_never_read_empty(ds: DataStore) -> None:
    """Each read is one statement that is its own ownership check: with the node's
    ``owned`` row gone (a move's fence), count, has and page raise ``TableMissing``
    rather than answering 0, False or an empty page; back, they answer again."""
    from schemaless.names import quote
    from schemaless.owned import admin

    likes = Edges(ds, "likes", inverse="liked_by")
    user, entry = new_id(), new_id()
    likes.add(user, entry)
    topo = ds.cluster.current()
    shard = ds.cluster.shard_of_id(user)
    server = ds.cluster.server_of_shard(topo, shard)
    owned = quote(str(topo.owned_db), "owned")
    reads = (lambda: likes.count(user), lambda: likes.has(user, entry), lambda: likes.page(user))
    server.run(admin([f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {shard}"]))
    try:
        for read in reads:
            with pytest.raises(TableMissing):
                read()
    finally:
        server.run(admin([f"INSERT INTO {owned} (`shard`) VALUES ({shard})"]))
    assert (likes.count(user), likes.has(user, entry), [e.dst for e in likes.page(user)]) == (
        1,
        True,
        [entry],
    )


def test_the_delay_proxy_holds_each_way_and_passes_the_close_on(
    local_cluster: LocalCluster,
) -> None:
    """``bench.hotnode``'s proxy: a round trip through it takes the delay twice,
    replies of many chunks come whole and in order, and a client's close reaches the
    server (the connection goes away)."""
    import multiprocessing
    import time

    from bench.env import Servers
    from bench.hotnode import serve_proxies

    servers = Servers(tuple(local_cluster.addresses), str(local_cluster.option_file))
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=serve_proxies, args=(list(servers.addresses), 0.002, theirs))
    proc.start()
    try:
        via = Servers(tuple(mine.recv()), servers.option_file)
        db = via.connect(0)
        db.query("SELECT CONNECTION_ID()")
        conn_id = db.store_result().fetch_row()[0][0]
        took = []
        for i in range(20):
            began = time.perf_counter()
            db.query(f"SELECT {i}")
            assert db.store_result().fetch_row() == ((i,),)
            took.append(time.perf_counter() - began)
        assert 0.004 <= min(took) < 0.02
        db.query("SELECT 1; SELECT REPEAT('x', 300000); SELECT 3")  # chunks of 64 KiB
        assert read_results(db, None) == [((1,),), (("x" * 300000,),), ((3,),)]
        db.close()
        listed = "SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s"
        assert wait_until(lambda: servers.admin(0, listed, (conn_id,))[0][0] == 0)
    finally:
        proc.kill()
        proc.join()
