"""Dump and restore carry the edge types and feeds (schemaless.edges, schemaless.feeds):
through the CLI into another shard count every count, edge page, ``has`` and timeline
is the source's, and the restored feed takes posts, fans out and trims; an interrupted
restore resumes without doubling a count; bad table files and targets are refused
before anything is written."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from test_cli import Cli, cluster_env
from test_dump import live

from schemaless import CatalogError, DataStore, Edges, Feeds, Index, dumpfiles, new_id
from schemaless import dump as dumping
from schemaless.hashing import shard_of
from schemaless.local import LocalCluster
from schemaless.movesync import table_names
from schemaless.names import quote
from schemaless.owned import admin

USERS = 10
PULL = 3  # an author with more followers is pulled
BY_FEED = Index("by_feed", {"feed": "str(40)"}, counted=True)  # its counts are rebuilt


def graph(store: DataStore) -> tuple[Edges, Feeds]:
    return Edges(store, "likes", inverse="liked_by"), Feeds(store, "home", pull_threshold=PULL)


def populate(store: DataStore) -> list[bytes]:
    """Likes with data, a removed one, follows, posts fanned out, a pulled author."""
    likes, feeds = graph(store)
    users = [new_id() for _ in range(USERS)]
    for i, u in enumerate(users):
        for j in range(1, i % 4 + 2):
            likes.add(u, users[(i + j) % USERS], data={"weight": j} if j % 2 else None)
    likes.remove(users[1], users[2])
    star = users[0]
    for u in users[1:6]:
        feeds.follow(u, star)  # more than PULL followers: pulled by the worker
    for i, u in enumerate(users[1:], 1):
        feeds.follow(u, users[i % (USERS - 1) + 1])
    for i in range(16):
        feeds.post(users[i % 5], {"text": f"post {i}"})
    assert feeds.work(once=True) == 16
    feeds.post(star, {"text": "after the pull"})
    assert feeds.work(once=True) == 1
    return users


def pages(read: Callable[[str | None], Any], key: Callable[[Any], Any]) -> list[list[Any]]:
    """Every page of a paged read, each as a list of ``key`` of its items."""
    out, cursor = [], None
    while True:
        page = read(cursor)
        out.append([key(x) for x in page])
        cursor = page.cursor
        if cursor is None:
            return out


def observed(store: DataStore, users: list[bytes]) -> dict[str, Any]:
    """What a client sees of the graph and the timelines."""
    likes, feeds = graph(store)
    out: dict[str, Any] = {}
    for u in users:
        h = u.hex()
        out[f"count {h}"] = (likes.count(u), likes.count_inverse(u))
        out[f"follows {h}"] = (feeds.graph.count(u), feeds.graph.count_inverse(u))
        out[f"has {h}"] = [likes.has(u, v) for v in users]
        out[f"page {h}"] = pages(lambda c, u=u: likes.page(u, 2, c), lambda e: e)
        out[f"inverse {h}"] = pages(lambda c, u=u: likes.page_inverse(u, 2, c), lambda e: e)
        out[f"home {h}"] = pages(lambda c, u=u: feeds.home(u, 3, c), lambda e: e["id"])
        out[f"posts {h}"] = pages(lambda c, u=u: feeds.posts(u, 3, c), lambda e: e["id"])
    return out


def module_rows(store: DataStore, table: str) -> int:
    """The rows of a module table on every server of the map."""
    topo = store.cluster.refresh()
    total = 0
    for server in store.cluster.all_servers(topo).values():
        if table in table_names(server, str(topo.owned_db)):
            sql = f"SELECT COUNT(*) FROM {quote(str(topo.owned_db), table)}"
            total += int(server.run(admin([sql]))[0][0][0])
    return total


def test_edges_and_feeds_restore_into_another_shard_count_through_the_cli(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    src = make_store([BY_FEED], shards=4, changes=True)
    users = populate(src)
    before = observed(src, users)
    assert before[f"count {users[1].hex()}"][0] == 1  # the removed like is not counted
    assert len(before[f"home {users[1].hex()}"]) > 1  # timelines of several pages
    assert len(before[f"page {users[3].hex()}"]) == 2
    assert module_rows(src, "feed__home__pulled") == 2  # the star, on both servers
    assert any(shard_of(u, 4) % 3 != shard_of(u, 3) for u in users)  # rows move shard
    out = str(tmp_path / "d")
    dumped = Cli(cluster_env(local_cluster, src.cluster.topology.prefix)).ok("dump", out)
    assert "edge and feed tables: edges__home_followers, " in dumped.output
    manifest = dumping.read_manifest(out)
    inbox = manifest["tables"]["feed__home__inbox"]
    assert "ROW_FORMAT=COMPRESSED" in inbox["create"] and inbox["guarded"] is True
    assert inbox["columns"] == ["user", "at", "post", "author"]
    assert sum(inbox["files"].values()) == module_rows(src, "feed__home__inbox") > 0
    pulled = manifest["tables"]["feed__home__pulled"]
    assert pulled["guarded"] is False and pulled["files"] == {"all.jsonl": 1}
    assert module_rows(src, "counts") > 0  # the library's own: rebuilt, never dumped
    assert "counts" not in manifest["tables"] and "changes" not in manifest["tables"]

    target = make_store(shards=3, refresh_interval=0.1)
    restored = Cli(cluster_env(local_cluster, target.cluster.topology.prefix)).ok("restore", out)
    assert "restored 17 entities" in restored.output, restored.output
    assert "rows of 11 edge and feed tables" in restored.output
    assert "index by_feed: ready" in restored.output
    assert observed(target, users) == before
    assert target.count(BY_FEED, feed="home") == src.count(BY_FEED, feed="home") == 17
    for table in manifest["tables"]:
        wide = table.endswith("__pulled")  # on every server of each side
        assert module_rows(target, table) == module_rows(src, table), table
        assert wide or module_rows(target, table) == sum(
            manifest["tables"][table]["files"].values()
        )
    # the restored rows are guarded, and the graph and the feed keep working
    db = str(target.cluster.topology.owned_db)
    triggers = target.cluster.server_of_shard(target.cluster.topology, 0).run(
        "SELECT trigger_name FROM information_schema.triggers WHERE trigger_schema = %s"
        " AND event_object_table = 'edges__likes__n'",
        (db,),
    )
    assert [r[0] for r in triggers[0]] == ["edges__likes__n_gi"]  # written by upserts only
    likes, feeds = graph(target)
    likes.add(users[9], new_id())
    assert likes.count(users[9]) == before[f"count {users[9].hex()}"][0] + 1
    fresh = {"text": "after the restore"}
    feeds.post(users[6], fresh)
    assert feeds.work(once=True) == 1
    follower = users[5]  # follows users[6]
    assert feeds.home(follower, 1)[0]["id"] == fresh["id"]
    assert feeds.trim(keep=1) > 0 and feeds.trim(keep=1) == 0


def test_an_interrupted_restore_of_edges_resumes_with_exact_counts(
    make_store: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    src = make_store(shards=4, changes=True)
    users = populate(src)
    before = observed(src, users)
    manifest = dumping.dump(src, tmp_path / "d", encoding="native")
    tables = [t for t in manifest["tables"] if not t.endswith("__pulled")]
    monkeypatch.setattr(dumpfiles, "BATCH", 3)
    target = make_store(shards=5, refresh_interval=0.1)
    calls: list[int] = []

    def crash(n: int) -> None:
        calls.append(n)
        if sum(calls) > 17 + 10:  # the entities, then some rows of the tables
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        dumping.restore(target, tmp_path / "d", workers=1, progress=crash)
    written = sum(module_rows(target, t) for t in tables)
    assert 0 < written < sum(module_rows(src, t) for t in tables)
    dumping.restore(target, tmp_path / "d", workers=2)
    assert observed(target, users) == before
    for table in ("edges__likes", "edges__likes__n", "feed__home__inbox", "feed__home__posts"):
        assert module_rows(target, table) == module_rows(src, table), table


def first_file(directory: Path, table: str) -> Path:
    """A table's first file with rows."""
    manifest = dumping.read_manifest(directory)
    name = next(n for n, count in sorted(manifest["tables"][table]["files"].items()) if count)
    return directory / "tables" / table / name


def corrupt(directory: Path, table: str, row: Any) -> Path:
    """Replace the last row of a table's first file with rows with ``row``."""
    path = first_file(directory, table)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + (json.dumps(row) + "\n").encode())
    return path


def test_bad_table_files_and_targets_are_refused_before_anything_is_written(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    src = make_store(shards=2, changes=True)
    users = populate(src)
    good = tmp_path / "good"
    dumping.dump(src, good)

    def refused(copy: str, error: type[Exception], match: str, **kwargs: Any) -> DataStore:
        target = make_store(shards=3, **kwargs)
        with pytest.raises(error, match=match):
            dumping.restore(target, tmp_path / copy)
        assert live(target) == {} and target.indexes() == {}
        db = target.cluster.topology.owned_db
        for server in target.cluster.all_servers(target.cluster.topology).values():
            assert db is None or "edges__likes" not in table_names(server, db)  # not made
        return target

    def copy(name: str) -> Path:
        shutil.copytree(good, tmp_path / name)
        return tmp_path / name

    path = corrupt(
        copy("short"), "edges__likes", [{"$bytes": "00" * 15}, {"$bytes": "01" * 16}, 1, 1, None]
    )
    refused("short", dumping.DumpError, rf"{re.escape(str(path))}: row \d+: src is not a 16-byte")
    corrupt(copy("text"), "edges__likes__n", [{"$bytes": "00" * 16}, "seven"])
    refused("text", dumping.DumpError, r"row \d+: a value that is not an integer, bytes or null")
    name = first_file(copy("lost"), "feed__home__posts")
    name.write_bytes(b"".join(name.read_bytes().splitlines(keepends=True)[1:]))
    refused("lost", dumping.DumpError, "rows where the manifest says .*truncated")
    native = tmp_path / "native"
    dumping.dump(src, native, encoding="native")
    blob = first_file(native, "edges__likes")
    blob.write_bytes(blob.read_bytes() + msgpack.packb({"not": "a row"}))
    refused("native", dumping.DumpError, "row .*: not a list of 5 values")

    def edited(name: str, change: Callable[[dict[str, Any]], None]) -> None:
        directory = copy(name)
        manifest = json.loads((directory / dumping.MANIFEST).read_text())
        change(manifest["tables"])
        (directory / dumping.MANIFEST).write_text(json.dumps(manifest))

    def inject(tables: dict[str, Any]) -> None:
        entry = tables["edges__likes"]
        entry["create"] = entry["create"].replace("ENGINE=InnoDB", "ENGINE=InnoDB; DROP DATABASE x")

    edited("inject", inject)
    refused("inject", dumping.DumpError, "edges__likes: not a definition a dump carries")
    edited("owned", lambda tables: tables.update(owned=tables.pop("feed__home__pulled")))
    refused("owned", dumping.DumpError, "'owned' is not a module table a dump carries")
    edited("columns", lambda tables: tables["edges__likes"]["columns"].reverse())
    refused("columns", dumping.DumpError, "edges__likes: its columns, key, guard or files do not")
    # a target of the old layout, and one whose tables hold rows, are refused clearly
    refused(
        "good", CatalogError, "edge and feed tables .* need the owned layout", layout="databases"
    )
    busy = make_store(shards=3)
    Edges(busy, "likes", inverse="liked_by").add(new_id(), new_id())
    with pytest.raises(CatalogError, match=r"already has rows in edges__like.*: a restore never"):
        dumping.restore(busy, good)
    assert live(busy) == {}
    # the CLI: one line, exit 1
    cli = Cli(cluster_env(local_cluster, make_store(shards=3).cluster.topology.prefix))
    result = cli("restore", str(tmp_path / "short"))
    assert result.exit_code == 1 and "src is not a 16-byte id" in result.output
    assert len(users) == USERS


def test_a_dump_refuses_a_table_whose_rows_have_no_node(make_store: Any, tmp_path: Path) -> None:
    """A sharded module table must be keyed (shard, <16-byte id>): the id's shard is
    where restore puts a row.  Nothing of the dump is left to be taken for one."""
    src = make_store(shards=2)
    topo = src.cluster.refresh()
    db = str(topo.owned_db)
    server = src.cluster.server_of_shard(topo, 0)
    server.run(
        admin(
            [
                f"CREATE TABLE {quote(db, 'scores')} (`shard` SMALLINT UNSIGNED NOT NULL,"
                " `n` BIGINT NOT NULL, PRIMARY KEY (`shard`, `n`)) ENGINE=InnoDB"
            ]
        )
    )
    with pytest.raises(dumping.DumpError, match=r"scores: its primary key \('shard', 'n'\)"):
        dumping.dump(src, tmp_path / "d")
    assert not (tmp_path / "d" / dumping.MANIFEST).exists()
