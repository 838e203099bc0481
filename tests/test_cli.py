"""The ``schemaless`` CLI against the real local cluster (click's CliRunner)."""

from __future__ import annotations

import configparser
import json
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import MySQLdb
import pytest
from click.testing import CliRunner, Result

from schemaless.cli.main import cli
from schemaless.cli.where import literal
from schemaless.connect import open_store
from schemaless.local import LocalCluster

USER = "0f0e0d0c0b0a09080706050403020100"
OTHER_USER = "11111111-2222-3333-4444-555555555555"

TYPED = {
    "t_int": ["n:int"],
    "t_float": ["x:float"],
    "t_bool": ["flag:bool"],
    "t_str": ["s:str(20)"],
    "t_uuid": ["u:uuid"],
    "t_bytes": ["raw:bytes(8)"],
    "t_auto": ["a"],
}


def drop_prefix(cluster: LocalCluster, prefix: str) -> None:
    """DROP every database of a datastore prefix on every server."""
    pattern = prefix.replace("_", "\\_") + "\\_%"
    for server in cluster.servers:
        conn = MySQLdb.connect(
            host="127.0.0.1",
            port=server.port,
            read_default_file=str(cluster.option_file),
            read_default_group="client",
        )
        try:
            cur = conn.cursor()
            cur.execute("SHOW DATABASES LIKE %s", (pattern,))
            for (name,) in cur.fetchall():
                cur.execute(f"DROP DATABASE `{name}`")
        finally:
            conn.close()


def cluster_env(cluster: LocalCluster, prefix: str) -> dict[str, str | None]:
    """Point the CLI at the test cluster (and nothing from the caller's environment)."""
    return {
        "SCHEMALESS_LOCAL_DIR": str(cluster.base_dir),
        "SCHEMALESS_PREFIX": prefix,
        "SCHEMALESS_URL": None,
        "SCHEMALESS_USER": None,
        "SCHEMALESS_PASSWORD": None,
        "SCHEMALESS_OPTION_FILE": None,
    }


class Cli:
    """Runs ``schemaless`` commands in-process with a fixed environment."""

    def __init__(self, env: Mapping[str, str | None]) -> None:
        self.env = dict(env)

    def __call__(
        self, *args: str, input: str | None = None, env: Mapping[str, str | None] | None = None
    ) -> Result:
        runner = CliRunner(env={**self.env, **(env or {})})
        return runner.invoke(cli, list(args), input=input, catch_exceptions=False)

    def ok(self, *args: str, input: str | None = None) -> Result:
        result = self(*args, input=input)
        assert result.exit_code == 0, result.output
        return result

    def fails(self, *args: str, input: str | None = None, **kw: Any) -> str:
        """Run a command that must fail: exit 1, exactly one line on stderr; return it."""
        result = self(*args, input=input, **kw)
        assert result.exit_code == 1, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error: ")
        return lines[0]


@pytest.fixture(scope="module")
def prefix() -> str:
    return "cli_" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def run(local_cluster: LocalCluster, prefix: str) -> Iterator[Cli]:
    """A datastore of 8 shards with one ready index per column type, and a few posts."""
    cli_ = Cli(cluster_env(local_cluster, prefix))
    try:
        out = cli_.ok("init", "--shards", "8").output
        assert f"created datastore {prefix!r}: 8 logical shards on 2 servers" in out
        cli_.ok(
            "index", "create", "by_user",
            "--property", "user_id:uuid", "--property", "published:int",
            "--shard-on", "user_id",
        )  # fmt: skip
        cli_.ok("index", "create", "by_tag", "--property", "tags:str(16)", "--multi", "tags")
        for name, props in TYPED.items():
            args = [arg for p in props for arg in ("--property", p)]
            assert "is ready" in cli_.ok("index", "create", name, *args).output
        yield cli_
    finally:
        drop_prefix(local_cluster, prefix)


def posts(user: str, n: int, start: int = 1) -> str:
    lines = [
        json.dumps(
            {
                "user_id": {"$uuid": user},
                "published": 1_700_000_000 + i,
                "title": f"post {i}",
                "tags": ["all", f"t{i % 3}"],
            }
        )
        for i in range(start, start + n)
    ]
    return "\n".join(lines) + "\n"


def ids_of(output: str) -> list[str]:
    return [line.split()[0] for line in output.splitlines() if "version" in line]


def json_lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


# -- init and local ------------------------------------------------------------------


def test_init_is_idempotent_and_refuses_another_shard_count(run: Cli, prefix: str) -> None:
    out = run.ok("init", "--shards", "8").output
    assert f"datastore {prefix!r} already exists: 8 logical shards" in out
    assert "nothing changed" in run.ok("init").output
    line = run.fails("init", "--shards", "4")
    assert "8 logical shards" in line and "refusing to change it to 4" in line


def test_local_status_shows_the_servers(run: Cli, local_cluster: LocalCluster) -> None:
    out = run.ok("local", "status").output
    assert "2 of 2 servers running" in out
    for address in local_cluster.addresses:
        assert address in out
    data = json.loads(run.ok("local", "status", "--json").output)
    assert [s["address"] for s in data["servers"]] == local_cluster.addresses
    assert all(s["running"] for s in data["servers"])


def test_local_up_on_a_running_cluster_changes_nothing(
    run: Cli, local_cluster: LocalCluster
) -> None:
    pids = [s.pid() for s in local_cluster.servers]
    result = run.ok("local", "up", "--fast")
    assert [s.pid() for s in local_cluster.servers] == pids
    assert local_cluster.addresses[0] in result.output
    assert "SCHEMALESS_URL=" in result.output
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(local_cluster.option_file)
    assert parser["client"]["password"] not in result.output


def test_local_status_and_down_without_a_cluster(run: Cli, tmp_path: Path) -> None:
    empty = str(tmp_path / "none")
    status = run("local", "status", "--dir", empty)
    assert status.exit_code == 3 and "no local cluster" in status.output
    assert "no local cluster" in run.ok("local", "down", "--dir", empty).output  # idempotent


# -- put, get, delete ----------------------------------------------------------------


def test_put_one_entity_and_get_it_back(run: Cli) -> None:
    entity = {
        "id": "0190f3a4c2e47b3d8a1f5e6d7c8b9a01",
        "user_id": {"$uuid": OTHER_USER},
        "title": "héllo",
        "blob": {"$bytes": "00ff10"},
        "when": {"$datetime": "2024-01-02T03:04:05+01:00"},
        "nested": {"list": [1, 2.5, None, True]},
    }
    out = run.ok("put", input=json.dumps(entity)).stdout
    assert ids_of(out) == [entity["id"]]
    got = json_lines(run.ok("get", entity["id"], "--json").output)
    assert got == [entity]
    # the hyphenated form finds it too; the text form shows bytes as hex
    text = run.ok("get", "0190f3a4-c2e4-7b3d-8a1f-5e6d7c8b9a01").output
    assert "00ff10" in text and "héllo" in text and "(version)" in text


def test_put_json_lines_assigns_ids(run: Cli) -> None:
    result = run.ok("put", "--json", input=posts(USER, 3, start=100))
    rows = json_lines(result.stdout)
    assert len(rows) == 3 and all(len(r["id"]) == 32 and r["version"] > 0 for r in rows)
    got = json_lines(run.ok("get", "--json", *(r["id"] for r in rows)).output)
    assert [g["title"] for g in got] == ["post 100", "post 101", "post 102"]
    assert all(g["user_id"] == {"$uuid": str(uuid.UUID(USER))} for g in got)


def test_put_a_json_array(run: Cli) -> None:
    items = [{"title": "a"}, {"title": "b"}]
    assert len(ids_of(run.ok("put", input=json.dumps(items)).stdout)) == 2


def test_put_refuses_bad_input_in_one_line(run: Cli) -> None:
    line = run.fails("put", input='{"title": "ok"}\n{"title": \n')
    assert "line 2" in line and "invalid JSON" in line
    assert "id" in run.fails("put", input='{"id": "not-an-id"}')
    assert "$bytes" in run.fails("put", input='{"b": {"$bytes": "xyz"}}')
    assert "no entities" in run.fails("put", input="\n")


def test_get_and_delete_unknown_ids(run: Cli) -> None:
    missing = uuid.uuid4().hex
    assert missing in run.fails("get", missing)
    assert "'ID'" in run.fails("get", "nothex")
    put = run.ok("put", input='{"title": "short-lived"}')
    key = ids_of(put.stdout)[0]
    assert f"deleted {key}" in run.ok("delete", key).output
    assert key in run.fails("delete", key)
    assert key in run.fails("get", key)


# -- query ---------------------------------------------------------------------------


def test_query_table_json_and_cursor_paging(run: Cli) -> None:
    user = str(uuid.uuid4())
    ids = ids_of(run.ok("put", input=posts(user, 7)).stdout)
    table = run.ok("query", "by_user", "--where", f"user_id={user}", "--limit", "3").output
    header = table.splitlines()[0].split()
    assert header[:3] == ["id", "user_id", "published"]
    assert "next page: --cursor" in table
    # JSON lines, page after page, newest first
    seen: list[dict[str, Any]] = []
    cursor: list[str] = []
    for _ in range(5):
        result = run(
            "query", "by_user", "--where", f"user_id={user}", "--order", "-published",
            "--limit", "3", "--json", *cursor,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        seen += json_lines(result.stdout)
        if "next cursor:" not in result.stderr:
            break
        cursor = ["--cursor", result.stderr.split("next cursor:")[1].split()[0]]
    assert [e["published"] for e in seen] == [1_700_000_000 + i for i in range(7, 0, -1)]
    assert sorted(e["id"] for e in seen) == sorted(ids)
    everything = json_lines(
        run.ok("query", "by_user", "--where", f"user_id={user}", "--all", "--json",
               "--limit", "2").stdout
    )  # fmt: skip
    assert len(everything) == 7
    for bad in ("garbage", cursor[1]):  # not a cursor; another query's (ascending)
        refused = run("query", "by_user", "--where", f"user_id={user}", "--cursor", bad)
        assert refused.exit_code == 1 and "'--cursor'" in refused.stderr, refused.stderr
        assert "cursor" in refused.stderr.split("'--cursor'")[1], refused.stderr


def test_query_ranges_and_multi_valued(run: Cli) -> None:
    user = uuid.uuid4().hex
    run.ok("put", input=posts(user, 6))
    got = json_lines(
        run.ok(
            "query", "by_user", "--where", f"user_id={user}",
            "--where", "published>=1700000002", "--where", "published<1700000005", "--json",
        ).stdout
    )  # fmt: skip
    assert [e["published"] for e in got] == [1_700_000_002, 1_700_000_003, 1_700_000_004]
    tagged = json_lines(run.ok("query", "by_tag", "--where", "tags=t1", "--all", "--json").stdout)
    assert tagged and all("t1" in e["tags"] for e in tagged)


def test_query_on_properties_named_like_parameters(run: Cli) -> None:
    """Properties named like DataStore.query's parameters are conditions (a TypeError
    traceback before)."""
    props = ["--property", "order:int", "--property", "limit:int", "--property", "cursor:int"]
    run.ok("index", "create", "by_order", *props)
    entities = [{"order": 3, "limit": 5, "cursor": c, "title": f"c{c}"} for c in (1, 2)]
    run.ok("put", input="".join(json.dumps(e) + "\n" for e in entities))
    wheres = ["--where", "order=3", "--where", "limit=5", "--where", "cursor=2"]
    for extra in ([], ["--all"]):
        result = run.ok("query", "by_order", *wheres, "--include-building", "--json", *extra)
        assert [e["title"] for e in json_lines(result.stdout)] == ["c2"]


def test_where_converts_values_by_column_type(run: Cli) -> None:
    some_uuid = uuid.uuid4()
    entities = [
        {"n": -42},
        {"x": 2.5},
        {"x": 7.0},
        {"flag": True},
        {"s": "42"},
        {"u": {"$uuid": str(some_uuid)}},
        {"raw": {"$bytes": "cafe"}},
        {"a": 12},
        {"a": 1.5},
        {"a": "hello world"},
        {"a": "12"},
        {"a": {"$bytes": some_uuid.hex}},
    ]
    lines = "\n".join(json.dumps(e) for e in entities)
    ids = ids_of(run.ok("put", input=lines).stdout)
    by_entity = dict(zip(ids, entities, strict=True))

    def one(index: str, where: str) -> dict[str, Any]:
        found = json_lines(run.ok("query", index, "--where", where, "--json").stdout)
        assert len(found) == 1, (index, where, found)
        expected = dict(by_entity[found[0]["id"]])
        assert {k: v for k, v in found[0].items() if k != "id"} == expected
        return found[0]

    assert one("t_int", "n=-42")["n"] == -42
    assert one("t_float", "x=2.5")["x"] == 2.5
    assert one("t_float", "x=7")["x"] == 7.0
    assert one("t_bool", "flag=true")["flag"] is True
    assert json_lines(run.ok("query", "t_bool", "--where", "flag=no", "--json").stdout) == []
    assert one("t_str", "s=42")["s"] == "42"
    assert one("t_uuid", f"u={some_uuid}")["u"] == {"$uuid": str(some_uuid)}
    assert one("t_uuid", f"u={some_uuid.hex}")["u"] == {"$uuid": str(some_uuid)}
    assert one("t_bytes", "raw=0xCAFE")["raw"] == {"$bytes": "cafe"}
    assert one("t_auto", "a=12")["a"] == 12
    assert one("t_auto", "a=1.5")["a"] == 1.5
    assert one("t_auto", "a=hello world")["a"] == "hello world"
    assert one("t_auto", 'a="12"')["a"] == "12"
    assert one("t_auto", "a=str:12")["a"] == "12"
    assert one("t_auto", f"a=bytes:{some_uuid.hex}")["a"] == {"$bytes": some_uuid.hex}
    assert one("t_auto", f"a=uuid:{some_uuid}")["a"] == {"$bytes": some_uuid.hex}
    hinted = run.ok("query", "t_auto", "--where", f"a={some_uuid.hex}", "--json")
    assert json_lines(hinted.stdout) == []  # text: no match, and how to ask for the bytes
    assert f"--where a=bytes:{some_uuid.hex}" in hinted.stderr, hinted.stderr
    ranged = json_lines(run.ok("query", "t_auto", "--where", "a>=0", "--json").stdout)
    assert sorted(e["a"] for e in ranged) == [12]  # ints only: the range keeps its type


@pytest.mark.parametrize(
    ("text", "type_name", "expected"),
    [
        ("5", "int", 5),
        (" -5 ", "int", -5),
        ("5", "float", 5.0),
        ("1e3", "float", 1000.0),
        ("TRUE", "bool", True),
        ("off", "bool", False),
        ("abc", "str(10)", "abc"),
        ('"  spaced "', "str(10)", "  spaced "),
        ("00ff", "bytes(4)", b"\x00\xff"),
        (USER, "uuid", bytes.fromhex(USER)),
        ("7", "auto", 7),
        ("7.25", "auto", 7.25),
        ("nan", "auto", "nan"),
        ("1_000", "auto", "1_000"),
        ("http://x/y?a=1", "auto", "http://x/y?a=1"),
        ("int:7", "str(5)", 7),
        ("bool:yes", "auto", True),
        ('""', "str(10)", ""),
        ('""', "auto", ""),
        ('"=x"', "auto", "=x"),
        ("str:", "auto", ""),
    ],
)
def test_literal(text: str, type_name: str, expected: object) -> None:
    value = literal(text, type_name)
    assert value == expected and type(value) is type(expected)


def test_query_by_prefix(run: Cli) -> None:
    names = ["pfx%alice", "pfx%alison", "pfx%bob", "pfx_al", "pfx%al\\x"]
    run.ok("put", input="".join(json.dumps({"s": n}) + "\n" for n in names))
    run.ok("put", input='{"raw": {"$bytes": "fe01ff"}}\n{"raw": {"$bytes": "fe02"}}\n')

    def found(index: str, where: str, *more: str) -> list[Any]:
        got = run.ok("query", index, "--where", where, "--json", *more).stdout
        return [e.get("s", e.get("raw")) for e in json_lines(got)]

    assert found("t_str", "s__startswith=pfx%al") == ["pfx%al\\x", "pfx%alice", "pfx%alison"]
    assert found("t_str", "s__startswith=pfx%ali", "--order", "desc") == names[1::-1]
    assert found("t_str", "s__startswith=pfx_") == ["pfx_al"]
    assert found("t_bytes", "raw__startswith=0xfe01") == [{"$bytes": "fe01ff"}]
    line = run.fails("query", "t_int", "--where", "n__startswith=1")
    assert "'--where'" in line and "startswith needs a str(N) or bytes(N) column" in line


@pytest.mark.parametrize(
    ("where", "needle"),
    [
        ("user_id", "expected PROPERTY OP VALUE"),
        ("user_id!=3", "there is no != or in"),
        ("user_id in 1,2", "there is no != or in"),
        ("published>", "no value after the operator"),
        ("published>= ", "no value after the operator"),
        ("published<", "no value after the operator"),
        ("published<=", "no value after the operator"),
        ("user_id=", "no value after the operator"),
        ("user_id__startswith=", "no value after the operator"),
        ("published==5", "an operator typed twice"),
        ("published=>5", "an operator typed twice"),
        ("published<>5", "an operator typed twice"),
        ("nope=1", "no property 'nope'"),
        (f"user_id={USER[:30]}", "expected 32 hex characters"),
        ("published=soon", "published is int: expected an integer"),
    ],
)
def test_bad_where_names_the_option(run: Cli, where: str, needle: str) -> None:
    line = run.fails("query", "by_user", "--where", where)
    assert "'--where'" in line and needle in line


def test_where_empty_string_is_quoted(run: Cli) -> None:
    """``s>""`` is a value (the empty string); ``s>`` and ``index create --where k=``
    are refused before anything runs (a user's trial had ``link>`` run as ``> ''``)."""
    run.ok("put", input='{"s": ""}\n{"s": "nonempty"}\n')
    above = json_lines(run.ok("query", "t_str", "--where", 's>""', "--json").stdout)
    assert "nonempty" in [e["s"] for e in above] and "" not in [e["s"] for e in above]
    assert "no value" in run.fails("count", "t_str", "--where", "s>", "--no-exact")
    line = run.fails("index", "create", "by_empty", "--property", "s", "--where", "kind=")
    assert "'--where'" in line and "no value after the operator" in line
    assert "by_empty" not in run.ok("index", "list").output


def test_bad_options_name_the_option(run: Cli) -> None:
    assert "'--order'" in run.fails("query", "by_user", "--order", "title")
    assert "'--where'" in run.fails(
        "query", "by_user", "--where", f"user_id={USER}", "--where", f"user_id={USER}"
    )
    assert "'--property'" in run.fails("index", "create", "bad", "--property", "x:varchar")
    assert "'--property'" in run.fails("index", "create", "bad", "--property", "a-b")
    assert "'--shard-on'" in run.fails(
        "index", "create", "bad", "--property", "x", "--shard-on", "y"
    )
    assert "'--multi'" in run.fails("index", "create", "bad", "--property", "x", "--multi", "y")
    assert "'--prefix'" in run.fails("shards", "--prefix", "Bad-Prefix")
    assert "'NAME'" in run.fails("index", "create", "Bad;Name", "--property", "x")
    assert "'--server'" in run.fails("init", "--server", "host:notaport")
    assert "'INDEX'" in run.fails("query", "missing_index")


# -- indexes -------------------------------------------------------------------------


def test_index_lifecycle_on_a_live_datastore(run: Cli) -> None:
    run.ok("put", input=posts(uuid.uuid4().hex, 3))
    out = run.ok("index", "create", "by_title", "--property", "title:str(64)").output
    assert "is building" in out and "cleaner --index=by_title" in out
    again = run.ok("index", "create", "by_title", "--property", "title:str(64)").output
    assert "already exists and is building" in again
    line = run.fails("index", "create", "by_title", "--property", "title:str(65)")
    assert "different definition" in line

    listing = run.ok("index", "list").output
    row = next(line for line in listing.splitlines() if line.startswith("by_title"))
    assert "building" in row and "0.0%" in row and "title:str(64)" in row
    listed = {r["name"]: r for r in json_lines(run.ok("index", "list", "--json").output)}
    assert listed["by_title"]["backfill"] == 0.0 and listed["by_title"]["state"] == "building"
    assert listed["by_user"]["backfill"] == 1.0 and listed["by_user"]["state"] == "ready"
    assert listed["by_user"]["definition"]["properties"] == [
        ["user_id", "uuid"],
        ["published", "int"],
    ]

    status = run.ok("index", "status", "by_title").output
    assert "index by_title: building" in status
    assert "backfill: 0.0% scanned" in status and "rate unknown" in status
    assert "max added_id" in status and "next: cleaner --index=by_title" in status
    report = json.loads(run.ok("index", "status", "by_title", "--json").output)
    shards = report["backfill"]["shards"]
    assert len(shards) == 8 and report["backfill"]["fraction"] == 0.0
    assert all(s["position"] == 0 and s["max_added_id"] is not None for s in shards)
    assert "is building" in run.fails("query", "by_title", "--where", "title=post 1")
    run.ok("query", "by_title", "--where", "title=post 1", "--include-building")

    ready = run.ok("index", "status", "by_user").output
    assert "index by_user: ready" in ready and "backfill: done" in ready

    dropped = run.ok("index", "drop", "by_title").output  # it did not say how to purge
    assert "dropped" in dropped and "`schemaless index drop by_title --purge`" in dropped
    assert "is dropped" in run.fails("query", "by_title")
    assert "purged" in run.ok("index", "drop", "by_title", "--purge").output
    assert "by_title" not in run.ok("index", "list").output
    assert "'NAME'" in run.fails("index", "status", "by_title")
    assert "'NAME'" in run.fails("index", "drop", "by_title")


@contextmanager
def _then_dropped(run: Cli, prefix: str, local: str, index: str) -> Iterator[None]:
    """Afterwards, however the block ends: every status row (heartbeats) is deleted and
    ``index`` dropped with its tables."""
    try:
        yield
    finally:
        with open_store(prefix=prefix, local_dir=local) as ds:
            ds.cluster.catalog.server.run(f"DELETE FROM `{prefix}_catalog`.`status`")
        run.ok("index", "drop", index, "--purge")


def test_index_status_reads_checkpoints_and_heartbeats(
    run: Cli, prefix: str, local_cluster: LocalCluster
) -> None:
    local = str(local_cluster.base_dir)

    run.ok("put", input=posts(uuid.uuid4().hex, 4))
    run.ok("index", "create", "by_title2", "--property", "title:str(64)")
    with open_store(prefix=prefix, local_dir=local) as ds:
        cat = ds.cluster.catalog
        for shard in range(8):
            cat.save_checkpoint("backfill:by_title2", shard, 10**9, True, 5)
        cat.heartbeat(
            "cleaner-test",
            {"state": "backfilling", "backlog": 17, "index": "by_title2", "rows_per_s": 250},
        )
        cat.heartbeat("backfill:another_index", {"state": "done", "rows_backfilled": 3})
    with _then_dropped(run, prefix, local, "by_title2"):
        out = run.ok("index", "status", "by_title2").output
        assert "backfill: 100.0% scanned, 0 of 8 shards still to scan, 40 rows added" in out
        assert "rate 250 rows/s (from cleaner-test's heartbeat), ETA 0s" in out
        assert "cleaner-test (backfilling): last heartbeat" in out
        assert "orphan backlog 17" in out
        assert "another_index" not in out  # another index's backfill is not shown
        # --watch repeats until the index is no longer building (here: marked ready soon)
        with open_store(prefix=prefix, local_dir=local) as ds:
            timer = threading.Timer(0.8, ds.cluster.catalog.set_index_state, ("by_title2", "ready"))
            timer.start()
            try:
                watched = run.ok("index", "status", "by_title2", "--watch", "0.1", "--json")
            finally:
                timer.join()
        reports = json_lines(watched.output)
        assert reports[-1]["state"] == "ready" and reports[-1]["backfill"]["fraction"] == 1.0
        assert reports[0]["daemons"][0]["orphan_backlog"] == 17
        building = [r for r in reports if r["state"] == "building"]
        assert building[0]["backfill"]["rate_source"].startswith("from cleaner-test")
        for later in building[1:]:  # measured between the views
            assert later["backfill"]["rate_source"].startswith("measured over")
            assert later["backfill"]["rows_per_s"] == 0.0


def test_index_status_shows_every_part_of_a_backfill(
    run: Cli, prefix: str, local_cluster: LocalCluster
) -> None:
    local = str(local_cluster.base_dir)
    run.ok("index", "create", "by_title3", "--property", "title:str(64)")
    with open_store(prefix=prefix, local_dir=local) as ds:
        cat = ds.cluster.catalog
        for part, rate in ((1, 100), (2, 150)):
            figures = {"state": "backfilling", "index": "by_title3", "rows_per_s": rate}
            cat.heartbeat(f"backfill:by_title3:{part}/2", figures)
        cat.heartbeat("backfill:by_title3x", {"state": "backfilling", "rows_per_s": 7})
    with _then_dropped(run, prefix, local, "by_title3"):
        out = run.ok("index", "status", "by_title3").output
        assert "rate 250 rows/s (sum of 2 parts' heartbeats)" in out
        assert "backfill:by_title3:1/2 (backfilling)" in out
        assert "backfill:by_title3:2/2 (backfilling)" in out
        assert "by_title3x" not in out  # another index whose name starts the same


# -- shards --------------------------------------------------------------------------


def test_shards_counts_live_entities_and_tombstones(run: Cli, prefix: str) -> None:
    def totals() -> tuple[int, int]:
        rows = json_lines(run.ok("shards", "--json").output)
        assert [len(r["shards"]) for r in rows] == [4, 4]
        assert all(r["size_bytes"] > 0 for r in rows)
        assert rows[0]["catalog_size_bytes"] > 0 and rows[1]["catalog_size_bytes"] is None
        return sum(r["live"] for r in rows), sum(r["tombstones"] for r in rows)

    live, dead = totals()
    keys = ids_of(run.ok("put", input=posts(uuid.uuid4().hex, 3)).stdout)
    run.ok("delete", keys[0])
    assert totals() == (live + 2, dead + 1)
    out = run.ok("shards").output
    assert f"datastore {prefix!r}: 8 logical shards on 2 servers" in out
    assert f"layout owned: one database {prefix}_data per server" in out
    assert out.splitlines()[1].split() == ["server", "address", "shards", "live", "tombstones",
                                           "size"]  # fmt: skip
    assert f"catalog {prefix}_catalog" in out
    per_shard = run.ok("shards", "--per-shard").output.splitlines()
    seventh = next(line.split() for line in per_shard if line.split()[:1] == ["7"])
    assert seventh[1] == f"{prefix}_data" and seventh[-1] == "-"  # no size per shard
    per_shard_json = json_lines(run.ok("shards", "--per-shard", "--json").output)
    assert sum(s["live"] for r in per_shard_json for s in r["per_shard"]) == live + 2
    assert {r["layout"] for r in per_shard_json} == {"owned"}
    estimate = run.ok("shards", "--estimate").output
    assert "rows (estimate)" in estimate
    guessed = json_lines(run.ok("shards", "--estimate", "--json").output)
    assert all(r["estimated"] and r["live"] >= 0 for r in guessed)


def test_init_and_shards_in_the_databases_layout(local_cluster: LocalCluster) -> None:
    """``init --layout databases`` makes the old layout: ``shards`` says so and shows a
    database and a size per shard; ``init`` refuses to change an existing layout."""
    prefix = "clidbs_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        out = run.ok("init", "--shards", "4", "--layout", "databases").output
        assert "4 logical shards on 2 servers (layout databases)" in out
        run.ok("put", input=posts(uuid.uuid4().hex, 5))
        out = run.ok("shards").output
        assert "layout databases: a database per logical shard" in out
        per_shard = run.ok("shards", "--per-shard", "--json").output
        rows = [s for r in json_lines(per_shard) for s in r["per_shard"]]
        assert sorted(s["database"] for s in rows) == [f"{prefix}_000{n}" for n in range(4)]
        assert sum(s["live"] for s in rows) == 5 and all(s["size_bytes"] > 0 for s in rows)
        assert "layout databases" in run.ok("init").output  # again: nothing changed
        line = run.fails("init", "--layout", "owned")
        assert "exists in the databases layout, not owned" in line and "schemaless dump" in line
    finally:
        drop_prefix(local_cluster, prefix)


# -- help, errors, secrets -----------------------------------------------------------


def walk(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from walk(sub, (*path, name))


def test_every_command_has_help_with_an_example() -> None:
    paths = list(walk(cli))
    assert ("index", "status") in paths and ("local", "up") in paths and ("query",) in paths
    runner = CliRunner()
    for path in paths:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Example:" in result.output, path
        example = result.output.split("Example:")[1]
        assert "schemaless " + " ".join(path) in example, path


def test_errors_are_one_line_with_exit_status_1(
    run: Cli, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    line = run.fails("index", "list", env={"SCHEMALESS_PREFIX": "cli_absent"})
    assert "no datastore 'cli_absent'" in line  # it said `schemaless init`: the default's
    assert "run `schemaless --prefix cli_absent init` first" in line, line
    line = run.fails("shards", env={"SCHEMALESS_LOCAL_DIR": str(tmp_path)})
    assert "schemaless local up" in line
    line = run.fails("index", "status", "nope")
    assert "no index named 'nope'" in line


def test_url_and_option_file_connect(run: Cli, local_cluster: LocalCluster) -> None:
    env = {
        "SCHEMALESS_LOCAL_DIR": "/nonexistent",
        "SCHEMALESS_OPTION_FILE": str(local_cluster.option_file),
    }
    result = run("index", "list", "--url", local_cluster.addresses[0], env=env)
    assert result.exit_code == 0, result.output
    assert "by_user" in result.output


def test_the_password_is_never_printed(run: Cli, local_cluster: LocalCluster) -> None:
    sentinel = "SENTINELpw42"
    port = local_cluster.servers[0].port
    cases: list[tuple[list[str], dict[str, str | None]]] = [
        (["index", "list"], {"SCHEMALESS_URL": f"mysql://schemaless:{sentinel}@127.0.0.1:{port}"}),
        (["shards", "--url", f"mysql://schemaless:{sentinel}@127.0.0.1:{port}"], {}),
        (["init", "--server", f"mysql://schemaless:{sentinel}@127.0.0.1:{port}"], {}),
        (["get", USER], {"SCHEMALESS_URL": f"127.0.0.1:{port}", "SCHEMALESS_PASSWORD": sentinel}),
        (["index", "list", "--help"], {"SCHEMALESS_URL": f"mysql://u:{sentinel}@h:1"}),
    ]
    for args, env in cases:
        result = run(*args, env=env)
        assert sentinel not in result.output, (args, result.output)
        assert sentinel not in result.stderr
        if "--help" not in args:
            assert result.exit_code == 1, result.output
            assert len(result.stderr.splitlines()) == 1
            assert "denied" in result.stderr.lower(), result.stderr


def test_cli_indexes_and_queries_a_path(run: Cli) -> None:
    run.ok(
        "index", "create", "by_author_id",
        "--property", "author.id:uuid", "--property", "published:int",
    )  # fmt: skip
    author = "0f" * 16
    lines = [
        json.dumps({"author": {"id": {"$uuid": author}}, "published": i, "title": f"p{i}"})
        for i in range(3)
    ]
    run.ok("put", input="\n".join(lines) + "\n")
    got = json_lines(
        run.ok(
            "query", "by_author_id", "--where", f"author.id={author}", "--where", "published>=1",
            "--include-building", "--json",
        ).stdout
    )  # fmt: skip
    assert [e["title"] for e in got] == ["p1", "p2"]
    table = run.ok(
        "query", "by_author_id", "--where", f"author.id={author}", "--include-building",
        "--columns", "author.id,published,title",
    ).output.splitlines()  # fmt: skip
    assert table[2].split() == [str(uuid.UUID(author)), "0", "p0"], table  # the path's value
    for bad in ("a..b:int", "a.:int", ".a:int"):
        line = run.fails("index", "create", "bad", "--property", bad)
        assert "'--property'" in line and "a nested path: NAME.NAME" in line
    line = run.fails("query", "by_author_id", "--where", "author..id=1", "--include-building")
    assert "'--where'" in line
    assert "by_author_id" in run.ok("index", "list").output


def test_cli_partial_index(run: Cli) -> None:
    out = run.ok(
        "index", "create", "posts_by_n", "--property", "n:int", "--where", "kind=post",
        "--where", "meta.draft=bool:false",
    ).output  # fmt: skip
    assert "where kind='post' and meta.draft=False" in out
    lines = [
        json.dumps({"n": 4000 + i, "kind": kind, "meta": {"draft": False}})
        for i, kind in enumerate(["post", "comment", "post"])
    ]
    run.ok("put", input="\n".join(lines) + "\n")
    got = json_lines(
        run.ok("query", "posts_by_n", "--where", "n>=4000", "--include-building", "--json").stdout
    )
    assert [e["n"] for e in got] == [4000, 4002]
    listing = run.ok("index", "list").output
    assert "n:int where kind='post' and meta.draft=False" in listing
    status = run.ok("index", "status", "posts_by_n").output
    assert "where       kind='post' and meta.draft=False" in status
    listed = {r["name"]: r for r in json_lines(run.ok("index", "list", "--json").output)}
    assert listed["posts_by_n"]["definition"]["where"] == {"kind": "post", "meta.draft": False}
    line = run.fails("index", "create", "posts_by_n", "--property", "n:int", "--where", "kind=x")
    assert "different definition" in line
    line = run.fails("index", "create", "bad", "--property", "n:int", "--where", "n=many")
    assert "'--where'" in line and "does not fit the index's column int" in line
    line = run.fails("index", "create", "bad", "--property", "n:int", "--where", "kind")
    assert "'--where'" in line and "expected NAME=VALUE" in line
    assert "bad" not in run.ok("index", "list").output.split()
