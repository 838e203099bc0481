"""One server of three stopped, then frozen (SIGSTOP): a new process opens with the
catalog alone and serves every call whose shards are on the healthy servers; calls
that need the sick one fail fast with ``ShardUnavailable``; the CLI shows the sick
server's figures as ``unknown``; the catalog's own server down is ``CatalogUnavailable``
within the connect timeout."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from schemaless import CatalogError, CatalogUnavailable, DataStore, Index
from schemaless.cli.main import cli
from schemaless.hashing import shard_of
from schemaless.local import LocalCluster
from schemaless.owned import admin

from .helpers import ids_on, run_cli, scratch_cluster, values_on

CLIENT = Path(__file__).with_name("partial_client.py")
REPO = Path(__file__).resolve().parents[2]
#: The timeouts of the fresh clients (seconds).
TIMEOUT = 1.0
#: What opening may take at most: never a timeout's wait on the sick server.
OPEN_LIMIT = 0.9 * TIMEOUT
SICK = 2  # the server made sick (server 0 holds the catalog)
_ROUNDS = itertools.count(1)  # each test's own values of n

BY_N = Index("by_n", {"n": "int"})
BY_M = Index("by_m", {"m": "int"})  # declared over data: stays building


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with scratch_cluster("partial", servers=3, durable=False) as made:
        yield made


@pytest.fixture(scope="module")
def store(cluster: LocalCluster) -> Iterator[DataStore]:
    """A datastore of 6 logical shards (2 a server), ``by_n`` ready, ``by_m`` building."""
    ds = DataStore(
        cluster.addresses,
        [BY_N],
        prefix="p_" + uuid.uuid4().hex[:10],
        option_file=str(cluster.option_file),
        shards=6,
        refresh_interval=0.2,
    )
    ds.put({"n": 0})
    assert ds.declare_index(BY_M) == "building"
    yield ds
    ds.close()


@pytest.fixture
def entities(store: DataStore, cluster: LocalCluster) -> Iterator[dict[int, list[dict[str, Any]]]]:
    """Per server: two entities whose entity and ``by_n`` rows both live there; every
    server running again after the test."""
    out = {}
    for sid in range(3):
        values = values_on(store, BY_N, sid, 2, start=10_000 * next(_ROUNDS) + 1000 * sid)
        out[sid] = [{"id": k, "n": n} for k, n in zip(ids_on(store, sid, 2), values, strict=True)]
        store.put_many(out[sid])
    yield out
    for s in cluster.servers:
        if s.pid() is None:
            cluster.start_server(s.index)
        else:
            cluster.resume_server(s.index)


def _client(
    cluster: LocalCluster, store: DataStore, plan: list[Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the plan in a fresh process: (the open's outcome, each operation's)."""
    cmd = [
        sys.executable,
        str(CLIENT),
        *cluster.addresses,
        f"--prefix={store.cluster.topology.prefix}",
        f"--option-file={cluster.option_file}",
        f"--timeout={TIMEOUT}",
        "--index=by_n:n",
        "--index=by_m:m",
    ]
    done = subprocess.run(
        cmd, input=json.dumps(plan).encode(), capture_output=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    return lines[0], lines[1:]


def _hex(entity: dict[str, Any]) -> str:
    return str(entity["id"].hex())


def _fresh(cluster: LocalCluster, store: DataStore) -> DataStore:
    """A new client of the module's datastore, with the fresh clients' timeouts."""
    return DataStore(
        cluster.addresses,
        prefix=store.cluster.topology.prefix,
        option_file=str(cluster.option_file),
        create=False,
        connect_timeout=TIMEOUT,
        read_timeout=TIMEOUT,
        write_timeout=TIMEOUT,
    )


def _sicken(cluster: LocalCluster, how: str, sid: int) -> None:
    if how == "stopped":
        cluster.stop_server(sid)
    else:
        cluster.pause_server(sid)


@pytest.mark.parametrize("how", ["stopped", "frozen"])
def test_a_new_process_serves_the_healthy_shards(
    cluster: LocalCluster,
    store: DataStore,
    entities: dict[int, list[dict[str, Any]]],
    how: str,
) -> None:
    healthy = entities[0] + entities[1]
    sick = entities[SICK]
    fresh = {"id": ids_on(store, 1, 1)[0].hex(), "n": values_on(store, BY_N, 0, 1, 7000)[0]}
    far = {"id": ids_on(store, 1, 1)[0].hex(), "n": values_on(store, BY_N, SICK, 1, 7000)[0]}
    plan = [
        ["get", _hex(healthy[0])],
        ["get", _hex(healthy[2])],
        ["get_many", [_hex(e) for e in healthy]],
        ["put", fresh],
        ["get", fresh["id"]],
        ["query", {"n": healthy[1]["n"]}],
        ["query", {"n__in": [e["n"] for e in healthy]}],
        ["delete", _hex(healthy[3])],
        ["get", _hex(healthy[3])],
        # what needs the sick server
        ["get", _hex(sick[0])],
        ["get_many", [_hex(healthy[0]), _hex(sick[1])]],
        ["put", {"id": _hex(sick[0]), "n": 1}],
        ["put", far],  # its by_n row lives on the sick server
        ["query", {"n": sick[0]["n"]}],
        ["query", {"n__in": [healthy[0]["n"], sick[0]["n"]], "partial": True}],
        ["delete", _hex(sick[1])],
    ]
    _sicken(cluster, how, SICK)
    opened, out = _client(cluster, store, plan)
    assert "opened" in opened, opened
    assert opened["opened"] < OPEN_LIMIT, opened
    results = [o.get("ok", o.get("error")) for o in out]
    assert results[:3] == [healthy[0]["n"], healthy[2]["n"], [e["n"] for e in healthy]], out
    assert isinstance(results[3], int) and results[4] == fresh["n"], out
    assert results[5] == {"ids": [_hex(healthy[1])], "missing": []}, out
    assert sorted(results[6]["ids"]) == sorted(_hex(e) for e in healthy), out
    assert results[6]["missing"] == [], out
    assert results[7:9] == [True, None], out  # deleted, then gone
    for o in out[9:14] + out[15:]:
        assert o.get("error") in ("ShardUnavailable", "ShardTimeout"), out
        assert o["seconds"] < TIMEOUT + 1.0, out
    assert results[14]["ids"] == [_hex(healthy[0])], out
    (row,) = BY_N.rows({"n": sick[0]["n"]})
    assert results[14]["missing"] == [shard_of(BY_N.shard_key(row), 6)], out


def test_the_catalog_server_down_is_a_typed_error_in_time(
    cluster: LocalCluster, store: DataStore, entities: dict[int, list[dict[str, Any]]]
) -> None:
    for how in ("stopped", "frozen"):
        _sicken(cluster, how, 0)
        started = time.monotonic()
        with pytest.raises(CatalogUnavailable) as info:
            _fresh(cluster, store)
        assert time.monotonic() - started < TIMEOUT + 1.0, how
        assert cluster.addresses[0] in str(info.value) and "start that server" in str(info.value)
        if how == "stopped":
            cluster.start_server(0)
        else:
            cluster.resume_server(0)


@pytest.mark.parametrize("how", ["frozen"])  # the harder case: a wait, not a refusal
def test_edges_and_feeds_open_and_serve_the_healthy_shards(
    cluster: LocalCluster,
    store: DataStore,
    entities: dict[int, list[dict[str, Any]]],
    how: str,
) -> None:
    """A new client opens an edge type and a feed (their tables checked on every
    server that answers) with one server sick, and serves the nodes of the others; a
    node on the sick server fails within the timeout, and a home timeline with a post
    stored there fails too, or, ``partial``, leaves it out and names its shard."""
    from schemaless import Edges, Feeds, ShardUnavailable

    home = Feeds(store, "home")  # tables made (and the change feed on) while all are up
    likes = Edges(store, "likes", inverse="liked_by")
    (fan,), (star,), (far,) = (ids_on(store, sid, 1) for sid in (0, 1, SICK))
    likes.add(fan, star)
    home.follow(fan, star)
    near, lost = {"id": ids_on(store, 0, 1)[0]}, {"id": ids_on(store, SICK, 1)[0]}
    home.post(star, near)
    home.post(star, lost)  # newest, its body on the sick server
    home.work(once=True)
    _sicken(cluster, how, SICK)
    started = time.monotonic()
    fresh = _fresh(cluster, store)
    try:
        edges, feeds = Edges(fresh, "likes", inverse="liked_by"), Feeds(fresh, "home")
        assert time.monotonic() - started < 2 * TIMEOUT + 1.0  # one wait on the sick one
        assert (edges.count(fan), edges.count_inverse(star), edges.has(fan, star)) == (1, 1, True)
        assert [e.dst for e in feeds.graph.page(fan)] == [star]
        with pytest.raises(ShardUnavailable):
            feeds.home(fan)
        page = feeds.home(fan, partial=True)  # what the healthy servers hold, and what not
        assert [e["id"] for e in page] == [near["id"]] and page.cursor is None
        assert page.missing_shards == (store.cluster.shard_of_id(lost["id"]),)
        started = time.monotonic()
        with pytest.raises(ShardUnavailable):  # ShardTimeout is one
            edges.count(far)
        assert time.monotonic() - started < TIMEOUT + 1.0
    finally:
        fresh.close()


# -- the CLI ---------------------------------------------------------------------------


def _partial_figures(result: Result, sick: str) -> None:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "unknown" in result.stdout, result.stdout
    assert sick in result.stderr and "unreachable" in result.stderr, result.stderr


@pytest.mark.parametrize("how", ["stopped", "frozen"])
def test_the_cli_shows_a_sick_server_as_unknown(
    cluster: LocalCluster,
    store: DataStore,
    entities: dict[int, list[dict[str, Any]]],
    how: str,
) -> None:
    sick = cluster.addresses[SICK]
    _sicken(cluster, how, SICK)
    _partial_figures(run_cli(cluster, store, "shards"), sick)
    if how == "frozen":
        return  # each command waits out a connect timeout: one is enough
    _partial_figures(run_cli(cluster, store, "index", "list"), sick)
    _partial_figures(run_cli(cluster, store, "index", "status", "by_m"), sick)
    listed = run_cli(cluster, store, "servers", "list")
    assert listed.exit_code == 0 and sick in listed.stdout, listed.stdout
    healthy = entities[0][0]
    got = run_cli(cluster, store, "get", _hex(healthy), "--json")
    assert got.exit_code == 0 and str(healthy["n"]) in got.stdout, got.stdout
    put = run_cli(cluster, store, "put", stdin=json.dumps({"id": _hex(entities[1][0]), "n": 5}))
    assert put.exit_code == 0, put.stderr
    found = run_cli(cluster, store, "query", "by_n", "--where", f"n = {healthy['n']}", "--json")
    assert found.exit_code == 0 and _hex(healthy) in found.stdout, found.stdout
    failed = run_cli(cluster, store, "get", _hex(entities[SICK][0]))
    assert failed.exit_code == 1 and sick in failed.stderr, failed.stderr


def test_query_partial_pages_the_servers_that_answer(
    cluster: LocalCluster, store: DataStore, entities: dict[int, list[dict[str, Any]]]
) -> None:
    """A query over every shard with SICK stopped: an error naming it and
    ``--partial``; with it, the healthy servers' entities and SICK named on stderr."""
    sick = cluster.addresses[SICK]
    cluster.stop_server(SICK)
    args = ["query", "by_n", "--where", "n>=0", "--limit", "1000", "--json"]
    failed = run_cli(cluster, store, *args)
    assert failed.exit_code == 1 and sick in failed.stderr, failed.stderr
    assert "`--partial` reads the servers that answer" in failed.stderr, failed.stderr
    shown = run_cli(cluster, store, *args, "--partial")
    assert shown.exit_code == 0, shown.stderr
    found = {json.loads(line)["id"] for line in shown.stdout.splitlines()}
    assert {_hex(e) for sid in (0, 1) for e in entities[sid]} <= found
    assert not {_hex(e) for e in entities[SICK]} & found
    assert "warning: unreachable: " + sick in shown.stderr, shown.stderr
    both = run_cli(cluster, store, *args, "--partial", "--all")
    assert both.exit_code == 1 and "--partial" in both.stderr, both.stderr


def test_a_dry_run_samples_the_servers_that_answer_and_create_refuses(
    cluster: LocalCluster, store: DataStore, entities: dict[int, list[dict[str, Any]]]
) -> None:
    """``index create --dry-run`` with a server stopped: the figures of the shards that
    answer, the others named (it used to fail); ``create`` itself fails, nothing
    declared."""
    sick = cluster.addresses[SICK]
    topo = store.cluster.refresh()
    stored = 0
    for sid in (0, 1):  # every entity row of the servers that answer, tombstones too
        table = f"`{topo.owned_db}`.`entities`"
        count = admin([f"SELECT COUNT(*) FROM {table}"])
        rows = store.cluster.server(topo.servers[sid]).run(count)[0]
        stored += int(rows[0][0])
    cluster.stop_server(SICK)
    args = ["index", "create", "by_k", "--property", "k:int", "--dry-run"]
    shown = run_cli(cluster, store, *args)
    assert shown.exit_code == 0, (shown.stdout, shown.stderr)
    assert sick in shown.stderr and "unreachable" in shown.stderr, shown.stderr
    assert f"not sampled  2 of 6 shards, on {sick}" in shown.stdout, shown.stdout
    assert "sampled      " in shown.stdout and "on 4 shards" in shown.stdout, shown.stdout
    report = json.loads(run_cli(cluster, store, *args, "--json").stdout)
    assert report["missing_shards"] == [s for s in range(6) if topo.shard_servers[s] == SICK]
    assert report["unreachable"] == [sick] and report["exact"] is False
    assert report["stored_rows"] == report["sampled_rows"] == stored
    declared = run_cli(cluster, store, *args[:-1])
    assert declared.exit_code == 1 and sick in declared.stderr, declared.stderr
    assert "index create needs every server" in declared.stderr, declared.stderr
    cluster.start_server(SICK)
    assert "by_k" not in store.cluster.refresh().indexes


# -- local mode --------------------------------------------------------------------------


def test_local_mode_opens_a_datastore_of_fewer_servers(cluster: LocalCluster) -> None:
    """A datastore on the first two of the local cluster's three servers: every command
    used to be refused ("servers ... are not part of datastore"), `servers add` too.
    The servers after the first must still be the datastore's."""
    prefix = "p2_" + uuid.uuid4().hex[:8]
    options = {"prefix": prefix, "option_file": str(cluster.option_file)}
    two = DataStore(cluster.addresses[:2], shards=4, **options)
    try:
        with pytest.raises(CatalogError, match="not part of datastore"):
            DataStore([cluster.addresses[0], cluster.addresses[2]], create=False, **options)
        env = {"SCHEMALESS_LOCAL_DIR": str(cluster.base_dir), "SCHEMALESS_PREFIX": prefix}
        runner = CliRunner(env={**env, "SCHEMALESS_URL": None, "SCHEMALESS_OPTION_FILE": None})
        shown = runner.invoke(cli, ["shards"], catch_exceptions=False)
        assert shown.exit_code == 0 and "on 2 servers" in shown.stdout, shown.output
        added = runner.invoke(cli, ["servers", "add", cluster.addresses[2]])
        assert added.exit_code == 0, added.output
        assert set(map(str, two.cluster.refresh().servers.values())) == set(cluster.addresses)
        # the catalog's server named otherwise than as recorded (127.1 is 127.0.0.1)
        port = cluster.addresses[0].rsplit(":", 1)[1]
        other = runner.invoke(
            cli,
            ["shards", "--url", f"127.1:{port}"],
            env={"SCHEMALESS_OPTION_FILE": str(cluster.option_file)},
        )
        assert other.exit_code == 0, other.output
    finally:
        two.close()
