"""Dump and restore against the real servers: a per-shard snapshot under concurrent
writes, restore into another shard count with the indexes backfilled, resume, the
native encoding with a codec dictionary, bad input, and the CLI commands."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
import pytest
from conftest import assert_clean, shard_rows
from test_cli import Cli, cluster_env, drop_prefix

from schemaless import (
    CatalogError,
    CorruptEntity,
    DataStore,
    Index,
    TableMissing,
    UniqueViolation,
    dumpfiles,
    new_id,
)
from schemaless import dump as dumping
from schemaless.cleaner.daemon import Cleaner
from schemaless.connect import open_store
from schemaless.hashing import shard_of
from schemaless.local import LocalCluster
from schemaless.names import quote
from schemaless.owned import UNCHECKED, admin

INDEXES = [
    Index("by_user", ["user_id", "n"], shard_on="user_id"),
    Index("by_title", [("title", "str(40)")], shard_on="title"),
    Index("by_tag", ["tags"], shard_on="tags", multi="tags"),
]

Live = dict[bytes, tuple[int, dict[str, Any]]]


def live(ds: DataStore) -> Live:
    """Every live entity, read from each shard's table: id -> (version, body)."""
    topo = ds.cluster.refresh()
    out: Live = {}
    for shard in range(topo.n_shards):
        rows = shard_rows(ds, shard, "entities", "`id`, `version`, `body`", "`body` IS NOT NULL")
        for key, version, body in rows:
            assert bytes(key) not in out
            out[bytes(key)] = (int(version), dict(ds.codec.decode(bytes(body))))
    return out


def entity(n: int, user: bytes) -> dict[str, Any]:
    return {"id": new_id(), "user_id": user, "n": n, "title": f"t{n % 13}", "tags": [n % 3, "x"]}


def load(ds: DataStore, n: int = 400) -> list[dict[str, Any]]:
    users = [new_id() for _ in range(5)]
    items = [entity(i, users[i % 5]) for i in range(n)]
    ds.put_many(items)
    return items


def snapshot_scenario(src: DataStore, out: Path, encoding: str, monkeypatch: Any) -> Live:
    """Dump ``src`` (one shard at a time, 5 rows a page) while writes land in the middle
    of logical shard 0's read; the dump's expected content."""
    items = load(src)
    on_zero = [e for e in items if shard_of(e["id"], 8) == 0]
    assert len(on_zero) > 20
    monkeypatch.setattr(dumping, "PAGE", 5)
    expected: Live = {}

    def write_once(n: int) -> None:
        if expected:
            return
        before = live(src)
        late = on_zero[-6:]  # read after this page, by added_id
        src.put_many([{**e, "n": e["n"] + 1000, "title": "changed"} for e in late[:3]])
        src.delete_many([e["id"] for e in late[3:]])
        src.put_many([entity(9000 + i, new_id()) for i in range(20)])  # some on shard 0
        after = live(src)
        expected.update({k: v for k, v in after.items() if shard_of(k, 8) != 0})
        expected.update({k: v for k, v in before.items() if shard_of(k, 8) == 0})
        assert expected != after  # the writes reached shard 0

    manifest = dumping.dump(src, out, encoding=encoding, workers=1, progress=write_once)
    assert sum(manifest["files"].values()) == len(expected)
    assert sorted((Index.from_dict(d) for d in manifest["indexes"]), key=str) == sorted(
        INDEXES, key=str
    )
    return expected


def restored(target: DataStore, expected: Live) -> None:
    """The target holds exactly the snapshot, and its indexes exactly its rows."""
    for info in target.cluster.refresh().indexes.values():
        assert info.state == "ready", info
    assert live(target) == expected
    assert_clean(target)
    some = next(iter(expected.values()))[1]
    found = {e.id for e in target.iter("by_user", user_id=some["user_id"])}
    assert found == {k for k, (_, b) in expected.items() if b["user_id"] == some["user_id"]}


def backfill(target: DataStore, names: list[str]) -> None:
    assert sorted(names) == sorted(i.name for i in INDEXES)
    for name in names:
        assert Cleaner(target, batch=100).backfill(name) == "ready"


def test_dump_under_writes_then_restore_into_another_shard_count(
    make_store: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    src = make_store(INDEXES, shards=8)
    expected = snapshot_scenario(src, tmp_path / "d", "jsonl", monkeypatch)
    target = make_store(shards=3, refresh_interval=0.1)
    backfill(target, dumping.restore(target, tmp_path / "d", workers=3))
    restored(target, expected)
    other = make_store(shards=2)
    other.put({"id": new_id(), "n": 1})
    with pytest.raises(CatalogError, match=r"already has entities: .* restore into a new, empty"):
        dumping.restore(other, tmp_path / "d")


def test_an_interrupted_restore_resumes_without_duplicates(
    make_store: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    src = make_store(INDEXES, shards=8)
    items = load(src, 300)
    dumping.dump(src, tmp_path / "d", encoding="native")
    monkeypatch.setattr(dumpfiles, "BATCH", 7)
    target = make_store(shards=5, refresh_interval=0.1)
    calls = []

    def crash(n: int) -> None:
        calls.append(n)
        if len(calls) == 10:
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        dumping.restore(target, tmp_path / "d", workers=1, progress=crash)
    assert 0 < len(live(target)) < len(items) and target.indexes() == {}
    seen: list[int] = []
    backfill(target, dumping.restore(target, tmp_path / "d", workers=2, progress=seen.append))
    assert sum(seen) == len(items)  # each entity counted once, skipped or written
    restored(target, live(src))
    rows = sum(shard_rows(target, s, "entities", "COUNT(*)")[0][0] for s in range(5))
    assert rows == len(items)
    assert dumping.restore(target, tmp_path / "d") == []  # again: nothing left to do


def test_native_dump_with_a_codec_dictionary(make_store: Any, tmp_path: Path) -> None:
    """An owned datastore's native dump, with bodies naming a codec dictionary,
    restored into a datastore of the old layout."""
    src = make_store(INDEXES, shards=8)
    load(src, 200)
    dict_id = src.train_dictionary(samples=200, size=4096)
    load(src, 50)  # bodies naming the dictionary
    manifest = dumping.dump(src, tmp_path / "d", encoding="native")
    assert list(manifest["dictionaries"]) == [str(dict_id)]
    assert manifest["layout"] == "owned"
    # into the layout of a database per shard: the dump is the same in both layouts
    target = make_store(shards=4, refresh_interval=0.1, layout="databases")
    backfill(target, dumping.restore(target, tmp_path / "d"))
    restored(target, live(src))


def test_dump_and_restore_touch_only_shards_a_server_owns(make_store: Any, tmp_path: Path) -> None:
    """Restored rows carry their shard through the owned layout's guard: a server that
    does not own a shard (its ``owned`` row gone, as after a move's fence) refuses the
    batch and keeps nothing of it; with the row back, the restore resumes.  A dump of
    such a shard fails too (its snapshot's check), rather than write an empty file."""
    src = make_store(shards=2)
    items = load(src, 40)
    dumping.dump(src, tmp_path / "d")
    target = make_store(shards=2, refresh_interval=0.1)
    topo = target.cluster.refresh()
    owned_rows = quote(topo.dbs[1], "owned")
    server = target.cluster.server_of_shard(topo, 1)
    server.run(admin([f"{UNCHECKED}DELETE FROM {owned_rows} WHERE `shard` = 1"]))
    with pytest.raises(TableMissing, match="not on this server"):
        dumping.restore(target, tmp_path / "d", workers=1)
    assert shard_rows(target, 1, "entities", "COUNT(*)") == [(0,)]
    server.run(admin([f"INSERT INTO {owned_rows} (`shard`) VALUES (1)"]))
    dumping.restore(target, tmp_path / "d")
    assert live(target) == live(src) and len(live(target)) == len(items)
    # a dump of a shard its server no longer owns fails, never an empty file
    owned_rows = quote(src.cluster.topology.dbs[0], "owned")
    server = src.cluster.server_of_shard(src.cluster.topology, 0)
    server.run(admin([f"{UNCHECKED}DELETE FROM {owned_rows} WHERE `shard` = 0"]))
    with pytest.raises(TableMissing, match=r"dumping logical shard 0: .*not on this server"):
        dumping.dump(src, tmp_path / "e", workers=1)
    assert not (tmp_path / "e" / dumping.MANIFEST).exists()
    assert not (tmp_path / "e" / "shard-0000.jsonl").exists()


def test_bad_directories(make_store: Any, tmp_path: Path) -> None:
    src = make_store(INDEXES, shards=2)
    with pytest.raises(dumping.DumpError, match="missing"):
        dumping.restore(src, tmp_path)
    dumping.dump(src, tmp_path / "d")
    with pytest.raises(dumping.DumpError, match="already holds a dump"):
        dumping.dump(src, tmp_path / "d")
    with pytest.raises(dumping.DumpError, match="unknown dump encoding"):
        dumping.dump(src, tmp_path / "e", encoding="csv")
    (tmp_path / "a file").write_text("")  # a user's trial: `dump /proc/nope`, a traceback
    with pytest.raises(dumping.DumpError, match=r"cannot make the dump directory .*a file/d"):
        dumping.dump(src, tmp_path / "a file" / "d")
    with pytest.raises(CatalogError, match="does not define"):
        dumping.restore(make_store([Index("other", ["x"], shard_on="x")]), tmp_path / "d")
    src.put({"id": new_id(), "n": 1})
    manifest = dumping.dump(src, tmp_path / "n", encoding="native")
    name = next(n for n, count in manifest["files"].items() if count)
    key = new_id()
    unknown = bytes((1, 2)) + (77).to_bytes(4, "big") + b"frame"  # names dictionary 77
    (tmp_path / "n" / name).write_bytes(msgpack.packb([key, 5, 1, unknown]))
    target = make_store(shards=2)
    with pytest.raises(CorruptEntity, match="dictionary 77"):
        dumping.restore(target, tmp_path / "n")
    assert live(target) == {}
    (tmp_path / "d" / "manifest.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(dumping.DumpError, match="not a dump manifest"):
        dumping.restore(src, tmp_path / "d")


def test_cli_dump_and_restore(make_store: Any, local_cluster: LocalCluster, tmp_path: Path) -> None:
    src = make_store(INDEXES, shards=4)
    items = load(src, 60)
    target = make_store(shards=2, refresh_interval=0.1)
    out = str(tmp_path / "d")
    dumped = Cli(cluster_env(local_cluster, src.cluster.topology.prefix))("dump", out)
    assert dumped.exit_code == 0 and "dumped 60 entities and 3 index definitions" in dumped.output
    cli = Cli(cluster_env(local_cluster, target.cluster.topology.prefix))
    result = cli("restore", out, "--no-backfill")
    assert result.exit_code == 0, result.output
    assert "restored 60 entities" in result.output and "cleaner --index=by_tag" in result.output
    assert "settings: entities never expire; change feed off" in result.output
    result = cli("restore", out)
    assert result.exit_code == 0 and "index by_user: ready" in result.output, result.output
    restored(target, live(src))
    again = cli("dump", out)
    assert again.exit_code == 1 and "already holds a dump" in again.output
    assert "dumping" not in again.output  # refused before the progress bar
    into_src = Cli(cluster_env(local_cluster, src.cluster.topology.prefix))("restore", out)
    assert into_src.exit_code == 1 and "restore into a new, empty one" in into_src.output
    assert len(items) == 60


def test_a_databases_datastore_moves_to_the_owned_layout_by_dump_and_restore(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    """The documented way over (docs/operations.md): dump a datastore of the old
    layout, restore into a new owned one with the CLI; the same entities, the indexes
    ready and exact, the settings carried, the new one's rows guarded."""
    tag = uuid.uuid4().hex[:8]
    old, new = f"old_{tag}", f"new_{tag}"
    src, dst = Cli(cluster_env(local_cluster, old)), Cli(cluster_env(local_cluster, new))
    try:
        src.ok("init", "--shards", "4", "--layout", "databases", "--changes")
        src.ok("index", "create", "by_title", "--property", "title:str(40)")
        src.ok("index", "create", "by_email", "--property", "email:str(64)", "--unique")
        lines = [json.dumps({"title": f"t{i % 7}", "email": f"u{i}@x"}) for i in range(50)]
        src.ok("put", input="\n".join(lines) + "\n")
        src.ok("dump", str(tmp_path / "d"))
        assert "exists in the databases layout" in src.fails("init", "--layout", "owned")
        assert "(layout owned)" in dst.ok("init", "--shards", "6").output
        out = dst.ok("restore", str(tmp_path / "d")).output
        assert "restored 50 entities" in out and "change feed on" in out
        assert "index by_title: ready" in out and "index by_email: ready" in out
        assert "layout owned" in dst.ok("shards").output
        with (
            open_store(prefix=old, local_dir=str(local_cluster.base_dir)) as before,
            open_store(prefix=new, local_dir=str(local_cluster.base_dir)) as after,
        ):
            assert after.cluster.topology.layout == "owned" and after.cluster.topology.changes
            assert live(after) == live(before) and len(live(after)) == 50
            assert_clean(after)
            assert len(after.query("by_title", title="t3", limit=50)) == 7
            with pytest.raises(UniqueViolation):
                after.put({"email": "u1@x"})
    finally:
        drop_prefix(local_cluster, old)
        drop_prefix(local_cluster, new)


BY_EMAIL = Index("by_email", {"email": "str(64)"}, unique=True)


@pytest.mark.parametrize("encoding", ["jsonl", "native"])
def test_the_copy_has_the_expiry_the_feed_and_the_unique_index(
    make_store: Any, tmp_path: Path, encoding: str
) -> None:
    src = make_store([BY_EMAIL], shards=4, expire_on="exp", changes=True)
    now = time.time()
    users = [{"email": f"u{i}@x", "exp": now + 3600} for i in range(40)]
    src.put_many(users)
    src.put_many([{"id": u["id"], "email": u["email"]} for u in users[::2]])  # never expire
    gone = {"email": "gone@x", "exp": now - 1}  # expired, not yet deleted
    src.put(gone)
    taken = {"email": "t@x", "exp": now - 1}
    src.put(taken)
    holder = {"email": "t@x"}  # takes the value of the expired one at once
    src.put(holder)
    manifest = dumping.dump(src, tmp_path / "d", encoding=encoding)
    assert manifest["settings"] == {"expire_on": "exp", "changes": True}
    assert [Index.from_dict(d) for d in manifest["indexes"]] == [BY_EMAIL]
    target = make_store(shards=3, refresh_interval=0.1)
    assert dumping.restore(target, tmp_path / "d") == ["by_email"]
    assert Cleaner(target, batch=7).backfill("by_email") == "ready"
    topo = target.cluster.refresh()
    assert (topo.expire_on, topo.changes) == ("exp", True)
    assert live(target) == live(src)
    assert_clean(target)
    # the unique index refuses duplicates, and an expired holder's value is free
    with pytest.raises(UniqueViolation):
        target.put({"email": "u2@x"})
    assert target.get_by("by_email", email="t@x") == holder
    assert target.get(taken["id"]) is None
    # expiry works: the dumped expired entities are hidden, then deleted
    assert target.get(gone["id"]) is None
    assert Cleaner(target).run_once()["expired_purged"] == 2
    again = {"email": "new@x"}
    target.put(again, ttl=3600)
    # the feed is on: a write is an event
    assert [e.entity for e in target.changes() if e.entity is not None] == [again]


def test_a_target_with_other_settings_is_refused_and_one_with_the_same_is_not(
    make_store: Any, tmp_path: Path
) -> None:
    src = make_store([BY_EMAIL], shards=2, expire_on="exp")
    src.put({"email": "a@x"})
    dumping.dump(src, tmp_path / "d")
    refusals = [
        (dict(expire_on="ttl"), "expires entities on 'ttl', the dump's datastore on 'exp'"),
        (dict(changes=True), "has the change feed on, the dump's datastore had it off"),
    ]
    for kwargs, message in refusals:
        target = make_store(shards=2, **kwargs)
        with pytest.raises(CatalogError, match=message):
            dumping.restore(target, tmp_path / "d")
        assert live(target) == {} and target.indexes() == {}
    same = make_store(shards=2, expire_on="exp", refresh_interval=0.1)
    assert dumping.restore(same, tmp_path / "d") == ["by_email"]
    assert live(same) == live(src)
    src.put({"email": "b@x"})  # a target already in use: the message says what to do
    with pytest.raises(CatalogError) as caught:
        dumping.restore(src, tmp_path / "d")
    assert "already has index 'by_email' but no finished restore of this dump" in str(caught.value)
    assert "restore into a new, empty one" in str(caught.value)


def test_a_dump_without_settings_restores_as_before_with_a_warning(
    make_store: Any, tmp_path: Path, caplog: Any
) -> None:
    src = make_store(INDEXES, shards=2, expire_on="exp")
    load(src, 30)
    dumping.dump(src, tmp_path / "d")
    path = tmp_path / "d" / dumping.MANIFEST
    manifest = json.loads(path.read_text())
    del manifest["settings"]  # as a dump made before settings were carried
    path.write_text(json.dumps(manifest))
    target = make_store(shards=3, refresh_interval=0.1)
    with caplog.at_level("WARNING", logger="schemaless.dump"):
        backfill(target, dumping.restore(target, tmp_path / "d"))
    assert "made before dumps carried the datastore's settings" in caplog.text
    assert target.cluster.refresh().expire_on is None
    restored(target, live(src))
    manifest["settings"] = {"expire_on": "no such", "changes": False}
    path.write_text(json.dumps(manifest))
    with pytest.raises(dumping.DumpError, match="bad settings"):
        dumping.restore(make_store(shards=2), tmp_path / "d")
