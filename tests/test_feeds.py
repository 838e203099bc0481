"""Timelines (schemaless.feeds) on real servers: push into inboxes by the worker,
pull for celebrities, unfollow and deletes hidden, and a brute-force oracle with the
worker SIGKILLed and restarted.  SCHEMALESS_FEEDS_SCALE=N runs an N times bigger oracle."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from test_cli import Cli, cluster_env

from schemaless import DataStore, Feeds, new_id
from schemaless import feeds as feeds_module
from schemaless.errors import InvalidCursor, InvalidId, InvalidQuery, TableMissing
from schemaless.feeds import WorkRound
from schemaless.local import LocalCluster
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import UNCHECKED, admin

_SCALE = int(os.environ.get("SCHEMALESS_FEEDS_SCALE", "1"))


@pytest.fixture
def ds(make_store: Callable[..., DataStore]) -> DataStore:
    return make_store(changes=True)


def _ids(page: list[dict[str, object]]) -> list[object]:
    return [e["id"] for e in page]


def test_push_home_unfollow_delete_and_pages(ds: DataStore) -> None:
    feeds = Feeds(ds, "home")
    ann, bob, cat = new_id(), new_id(), new_id()
    old = {"text": "before the follow"}
    feeds.post(bob, old)
    assert feeds.follow(ann, bob) is True and feeds.follow(ann, bob) is False
    assert _ids(feeds.home(ann)) == [old["id"]]  # the follow copied bob's newest posts
    posts = [{"text": f"p{i}"} for i in range(5)]
    versions = [feeds.post(bob if i % 2 else ann, p) for i, p in enumerate(posts)]
    assert versions == sorted(versions)
    assert feeds.work(once=True) == 6  # every post of the feed, the old one again
    assert feeds.work(once=True) == 0
    assert feeds.settle(timeout=5)
    want = [p["id"] for p in posts[::-1]] + [old["id"]]
    assert _ids(feeds.home(ann)) == want
    first = feeds.home(ann, limit=4)
    assert first.cursor is not None
    assert _ids(first) + _ids(feeds.home(ann, limit=4, cursor=first.cursor)) == want
    assert _ids(feeds.posts(bob)) == [posts[3]["id"], posts[1]["id"], old["id"]]
    assert _ids(feeds.home(cat)) == []
    ds.delete(posts[4]["id"])
    assert _ids(feeds.home(ann))[0] == posts[3]["id"]
    feeds.unfollow(ann, bob)
    assert _ids(feeds.home(ann)) == [posts[2]["id"], posts[0]["id"]]
    feeds.follow(cat, bob)
    feeds.post(bob, {"text": "late"})
    feeds.unfollow(cat, bob)
    feeds.work(once=True)  # fans out to no one now
    assert _ids(feeds.home(cat)) == []


def test_an_updated_post_keeps_its_place_and_is_never_doubled(ds: DataStore) -> None:
    """A later version of a post is fanned out again with the post's first time (its
    posts row's), so the inbox, whose only key is (reader, time, post), holds it once."""
    feeds = Feeds(ds, "home")
    ann, bob = new_id(), new_id()
    feeds.follow(ann, bob)
    first, second = {"text": "first"}, {"text": "second"}
    feeds.post(bob, first)
    feeds.post(bob, second)
    assert feeds.work(once=True) == 2
    ds.put({**(ds.get(first["id"]) or {}), "text": "first, edited"})  # a later version
    assert feeds.work(once=True) == 1
    pages, cursor = [], None
    while True:
        page = feeds.home(ann, limit=1, cursor=cursor)
        pages += _ids(page)
        if (cursor := page.cursor) is None:
            break
    assert pages == [second["id"], first["id"]]
    assert feeds.home(ann)[1]["text"] == "first, edited"
    topo = ds.cluster.current()
    keys = ds.cluster.server_of_shard(topo, 0).run(
        "SELECT DISTINCT index_name FROM information_schema.statistics"
        " WHERE table_schema = %s AND table_name = 'feed__home__inbox'",
        (topo.owned_db,),
    )[0]
    assert [k for (k,) in keys] == ["PRIMARY"]  # narrow: no second key per row
    row_format = ds.cluster.server_of_shard(topo, 0).run(
        "SELECT row_format, create_options FROM information_schema.tables"
        " WHERE table_schema = %s AND table_name = 'feed__home__inbox'",
        (topo.owned_db,),
    )[0]
    assert row_format[0][0] == "Compressed" and "key_block_size=8" in row_format[0][1]


def test_a_fan_out_in_many_rounds_reaches_every_follower(
    ds: DataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Followers read, and inbox rows written, a few at a time (``_FAN`` made 2): every
    follower gets the post once."""
    import schemaless.feeds

    monkeypatch.setattr(schemaless.feeds, "_FAN", 2)
    feeds = Feeds(ds, "home")
    star, fans = new_id(), [new_id() for _ in range(11)]
    for fan in fans:
        feeds.follow(fan, star)
    posts = [{"text": "one"}, {"text": "two"}]
    for post in posts:
        feeds.post(star, post)
    rounds: list[WorkRound] = []
    assert feeds.work(once=True, progress=rounds.append) == 2
    for fan in fans:
        assert _ids(feeds.home(fan)) == [posts[1]["id"], posts[0]["id"]]
    assert sum(r.posts for r in rounds) == 2  # each round told, the last caught up
    assert rounds[-1] == WorkRound(posts=0, owed=0, failing=False, behind_s=0.0)


def test_a_celebrity_is_pulled_once_above_the_threshold(ds: DataStore) -> None:
    feeds = Feeds(ds, "home", pull_threshold=2)
    star, fans = new_id(), [new_id() for _ in range(4)]
    feeds.follow(fans[0], star)
    feeds.follow(fans[1], star)
    pushed = {"text": "two followers: pushed"}
    feeds.post(star, pushed)
    feeds.work(once=True)
    feeds.follow(fans[2], star)  # three: above the threshold from now on
    pulled = {"text": "three followers: pulled"}
    feeds.post(star, pulled)
    feeds.work(once=True)
    inbox = _rows(ds, "SELECT `post` FROM `{db}`.`feed__home__inbox`")
    assert sorted(bytes(r[0]) for r in inbox) == sorted(
        [pushed["id"]] * 3  # fans 0 and 1 pushed, fan 2 backfilled; the pulled one: none
    )
    feeds.unfollow(fans[2], star)  # two again: a new worker still pulls (the list)
    later = {"text": "still pulled"}
    feeds.post(star, later)
    assert Feeds(ds, "home", pull_threshold=2).work(once=True) == 1
    assert _count(ds, "feed__home__inbox") == 2  # fans 0 and 1: pushed only
    feeds.follow(fans[2], star)
    feeds.follow(fans[3], star)
    for fan in fans:
        assert _ids(feeds.home(fan)) == [later["id"], pulled["id"], pushed["id"]]
    feeds.unfollow(fans[0], star)
    assert _ids(feeds.home(fans[0])) == []


def test_pull_pages_merge_every_server_and_build_each_statement_once(ds: DataStore) -> None:
    feeds = Feeds(ds, "home", pull_threshold=0)  # every author with a follower: pulled
    reader, authors = new_id(), [new_id() for _ in range(6)]
    for author in authors:
        feeds.follow(reader, author)
    posts = [(feeds.post(a, p), p) for _ in range(3) for a in authors for p in [{"n": 1}]]
    assert feeds.work(once=True) == 18
    want = [p["id"] for _, p in sorted(posts, key=lambda vp: (vp[0], vp[1]["id"]), reverse=True)]
    hits = feeds_module._posts_sql.cache_info().hits, feeds_module._home_sql.cache_info().hits
    got, cursor = [], None
    while True:
        page = feeds.home(reader, limit=4, cursor=cursor)
        got += _ids(page)
        if page.cursor is None:
            break
        cursor = page.cursor
    assert got == want
    # five pages: the statements of the keyset pages (same shards, n and shape) are cached
    assert feeds_module._home_sql.cache_info().hits >= hits[1] + 3
    assert feeds_module._posts_sql.cache_info().hits >= hits[0] + 3 * len(authors)


def test_an_expired_post_never_appears(make_store: Callable[..., DataStore]) -> None:
    ds = make_store(changes=True, expire_on="expires")
    feeds = Feeds(ds, "home")
    ann, bob = new_id(), new_id()
    feeds.follow(ann, bob)
    keep, gone = {"text": "stays"}, {"text": "expires", "expires": time.time() + 0.3}
    feeds.post(bob, keep)
    feeds.post(bob, gone)
    feeds.work(once=True)
    assert _ids(feeds.home(ann)) == [gone["id"], keep["id"]]
    time.sleep(0.4)
    assert _ids(feeds.home(ann, limit=1)) == [keep["id"]]
    assert _ids(feeds.posts(bob)) == [keep["id"]]


def test_a_fenced_shard_fails_home_and_posts_never_reads_empty(ds: DataStore) -> None:
    """Each read is its own ownership check: with the reader's (or a pulled author's)
    ``owned`` row gone, as a move's fence leaves it, ``home`` and ``posts`` raise
    ``TableMissing``; once it is back they read again."""
    feeds = Feeds(ds, "home", pull_threshold=0)
    ann, bob = new_id(), new_id()
    feeds.follow(ann, bob)
    post = {"text": "pulled"}
    feeds.post(bob, post)
    feeds.work(once=True)
    assert _ids(feeds.home(ann)) == _ids(feeds.posts(bob)) == [post["id"]]
    for fenced, read in ((ann, lambda: feeds.home(ann)), (bob, lambda: feeds.posts(bob))):
        topo = ds.cluster.current()
        shard = ds.cluster.shard_of_id(fenced)
        server = ds.cluster.server_of_shard(topo, shard)
        owned = quote(topo.owned_db, "owned")
        server.run(admin([f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {shard}"]))
        try:
            with pytest.raises(TableMissing):
                read()
            with pytest.raises(TableMissing):
                feeds.trim(keep=1)  # every shard's pass checks its own
        finally:
            server.run(admin([f"INSERT INTO {owned} (`shard`) VALUES ({shard})"]))
        assert _ids(read()) == [post["id"]]


def test_trim_keeps_each_readers_newest_rows(ds: DataStore, local_cluster: LocalCluster) -> None:
    """Readers over ``keep`` lose their oldest inbox rows, the others none; again: no
    change; the CLI does the same; bad ``keep`` is refused."""
    feeds = Feeds(ds, "home", backfill=0)
    bob, cat, readers = new_id(), new_id(), [new_id() for _ in range(5)]
    for reader in readers:
        feeds.follow(reader, bob)
    feeds.follow(readers[0], cat)
    posts = [{"n": i} for i in range(7)]
    for i, post in enumerate(posts):
        feeds.post(cat if i == 3 else bob, post)
    feeds.work(once=True)
    newest = [p["id"] for p in posts[::-1]]
    assert feeds.trim(keep=4) == 3 + 4 * 2  # reader 0: 7 rows, the others 6
    assert _ids(feeds.home(readers[0], limit=50)) == newest[:4]
    for reader in readers[1:]:
        assert _ids(feeds.home(reader, limit=50)) == [p for p in newest if p != posts[3]["id"]][:4]
    assert feeds.trim(keep=4) == 0
    assert _count(ds, "feed__home__inbox") == 5 * 4
    run = Cli(cluster_env(local_cluster, ds.cluster.topology.prefix))
    assert "5 inbox rows deleted" in run.ok("feeds", "trim", "home", "--keep", "3").output
    assert _count(ds, "feed__home__inbox") == 5 * 3
    for keep in (0, -1, "3", True):
        with pytest.raises(InvalidQuery, match="keep"):
            feeds.trim(keep)  # type: ignore[arg-type]
    assert "Invalid value for '--keep'" in run.fails("feeds", "trim", "home", "--keep", "0")
    assert _count(ds, "feed__home__inbox") == 5 * 3
    for command in (("trim", "hone"), ("work", "hone", "--once")):  # a typo: no new feed
        assert "unknown feed 'hone'" in run.fails("feeds", *command)
    assert not Feeds(ds, "hone", create=False).exists()


def test_bad_input_is_refused_and_writes_nothing(ds: DataStore) -> None:
    feeds = Feeds(ds, "home")
    ann, bob = new_id(), new_id()
    with pytest.raises(InvalidQuery, match="themselves"):
        feeds.follow(ann, ann)
    with pytest.raises(InvalidId):
        feeds.follow(ann, "bob")
    for bad in ("Home!", "a" * 31, "home__x", 7):
        with pytest.raises(InvalidQuery, match="invalid feed name"):
            Feeds(ds, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidQuery, match="poll must be"):
        feeds.work(once=True, poll=-1)
    for timeout in ("5", -1, float("nan")):  # "5" was a TypeError, -1 waited not at all
        with pytest.raises(InvalidQuery, match="timeout must be"):
            feeds.settle(timeout)  # type: ignore[arg-type]
    with pytest.raises(InvalidQuery, match="pull_threshold"):
        Feeds(ds, "home", pull_threshold=-1)
    with pytest.raises(InvalidQuery, match="mapping"):
        feeds.post(ann, ["text"])  # type: ignore[arg-type]
    feeds.post(ann, {"text": "a"})
    feeds.post(ann, {"text": "b"})
    feeds.follow(bob, ann)
    cursor = feeds.home(ann, limit=1).cursor
    with pytest.raises(InvalidQuery, match="another timeline"):
        feeds.home(bob, cursor=cursor)
    with pytest.raises(InvalidQuery, match="another timeline"):
        feeds.posts(ann, cursor=cursor)
    with pytest.raises(InvalidQuery, match="cursor"):
        feeds.home(ann, cursor="fc1.@@")
    with pytest.raises(InvalidCursor, match=r"not a timeline cursor: 'fc1\.AAAA'"):  # msgpack's
        feeds.home(ann, cursor="fc1.AAAA")  # "unpack(b) received extra data" before
    for limit in (0, 10**6):
        with pytest.raises(InvalidQuery, match="limit"):
            feeds.home(ann, limit=limit)
    assert feeds.graph.count(ann) == 0 and feeds.graph.count(bob) == 1


@pytest.fixture
def worker(
    ds: DataStore, local_cluster: LocalCluster
) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    env = {k: v for k, v in cluster_env(local_cluster, ds.cluster.topology.prefix).items() if v}
    code = "from schemaless.cli.main import cli; cli()"
    args = ["feeds", "work", "home", "--pull-threshold", "4", "--poll", "0.02"]

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], env={**os.environ, **env}, stderr=subprocess.PIPE
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_oracle_with_the_worker_killed_and_restarted_and_a_shard_moved(
    ds: DataStore, worker: Callable[[], subprocess.Popen[bytes]]
) -> None:
    rng = random.Random(41)
    feeds = Feeds(ds, "home", pull_threshold=4)
    users = [new_id() for _ in range(24 * _SCALE)]
    follows: dict[bytes, set[bytes]] = {u: set() for u in users}
    posts: dict[bytes, tuple[bytes, int]] = {}  # post -> (author, version)
    proc = worker()
    kills = 0
    for step in range(200 * _SCALE):
        a, b = rng.sample(users, 2)
        op = rng.random()
        if op < 0.35:
            feeds.follow(a, b)
            follows[a].add(b)
        elif op < 0.45:
            feeds.unfollow(a, b)
            follows[a].discard(b)
        elif op < 0.9:
            entity: dict[str, object] = {"n": step}
            posts_version = feeds.post(a, entity)
            posts[entity["id"]] = (a, posts_version)  # type: ignore[index]
        elif posts:
            gone = rng.choice(sorted(posts))
            ds.delete(gone)
            del posts[gone]
        if step == 100 * _SCALE:  # a shard moves under the worker and the writers
            topo = ds.cluster.current()
            moved = ds.cluster.shard_of_id(users[0])
            to = next(sid for sid in topo.servers if sid != topo.shard_servers[moved])
            ShardMover(ds).move(moved, to)
        if step % 35 == 34:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            proc = worker()
    assert kills >= 5
    assert ds.cluster.current().shard_servers[moved] == to
    assert feeds.settle(timeout=30), proc.stderr.read() if proc.stderr else ""
    pushed, pulled = _count(ds, "feed__home__inbox"), _count(ds, "feed__home__pulled")
    assert pushed > len(posts) and pulled >= 1  # both ways were taken
    for user in users:
        seen = follows[user] | {user}
        want = sorted(
            ((v, p) for p, (a, v) in posts.items() if a in seen), reverse=True
        )  # newest first, as the library orders (time, then id)
        got: list[bytes] = []
        cursor = None
        while True:
            page = feeds.home(user, limit=7, cursor=cursor)
            got += [e["id"] for e in page]
            cursor = page.cursor
            if cursor is None:
                break
        assert got == [p for _, p in want], f"user {users.index(user)}"
        assert feeds.graph.count(user) == len(follows[user])
        assert feeds.graph.count_inverse(user) == sum(user in f for f in follows.values())


def _rows(ds: DataStore, sql: str) -> list[tuple[object, ...]]:
    """A raw read of every server's data database (``{db}`` in ``sql``)."""
    query = "/*schemaless:admin*/ " + sql.format(db=ds.cluster.topology.owned_db)
    return [r for s in ds.cluster.servers() for r in s.run(query)[0]]


def _count(ds: DataStore, table: str) -> int:
    counts = [int(str(r[0])) for r in _rows(ds, "SELECT COUNT(*) FROM `{db}`.`" + table + "`")]
    return sum(counts) // (len(counts) if table.endswith("pulled") else 1)


def test_cli_worker_once(ds: DataStore, local_cluster: LocalCluster) -> None:
    feeds = Feeds(ds, "home")
    ann, bob = new_id(), new_id()
    feeds.follow(ann, bob)
    feeds.post(bob, {"text": "hi"})
    run = Cli(cluster_env(local_cluster, ds.cluster.topology.prefix))
    assert "1 posts fanned out" in run.ok("feeds", "work", "home", "--once").output
    assert len(feeds.home(ann)) == 1
    assert "invalid feed name 'Bad!'" in run.fails("feeds", "work", "Bad!", "--once")
    for option, value in (("--poll", "-1"), ("--pull-threshold", "-1")):
        line = run.fails("feeds", "work", "home", option, value)  # a traceback, once
        assert f"Invalid value for '{option}'" in line
