"""CLI commands with one server of two stopped or frozen (found in a new user's trial):
status commands show what the servers that answer hold and name the other, as
``shards`` does; a failed ``put`` says what it may have stored."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from schemaless import DataStore, Feeds, failpoints
from schemaless.cli.main import cli
from schemaless.local import LocalCluster
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import admin
from schemaless.subscriptions import feed_status

from .helpers import ids_of_shard, ids_on, run_cli

SICK = 1  # server 0 holds the catalog


def test_changes_status_shows_a_stopped_server_as_unknown(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """``changes --status`` used to fail with ``server unavailable`` when any server
    was down; now the lag it cannot read is ``unknown`` and the server is named."""
    store = fault_store(changes=True)
    store.subscribe("indexer")
    store.put({"n": 1})
    sick = fault_cluster.addresses[SICK]
    fault_cluster.stop_server(SICK)
    shown = run_cli(fault_cluster, store, "changes", "--status")
    assert shown.exit_code == 0, (shown.stdout, shown.stderr)
    assert "indexer" in shown.stdout and "unknown" in shown.stdout, shown.stdout
    assert sick in shown.stderr and "unreachable" in shown.stderr, shown.stderr
    (row,) = feed_status(store.cluster, partial=True)
    assert row["behind"] is None and row["unreachable"] == [sick]


def test_local_status_shows_a_frozen_server_as_paused(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """A server frozen with SIGSTOP still accepts TCP connections (the kernel does), so
    ``local status`` used to call it running; it is ``paused`` now, with how to resume."""
    fault_store()  # revives the servers after the test
    fault_cluster.pause_server(SICK)
    pid = fault_cluster.servers[SICK].pid()
    shown = CliRunner().invoke(cli, ["local", "status", "--dir", str(fault_cluster.base_dir)])
    assert shown.exit_code == 0, shown.output
    assert f"1 of 2 servers running (1 paused: `kill -CONT {pid}`" in shown.output, shown.output
    (line,) = [x for x in shown.output.splitlines() if fault_cluster.addresses[SICK] in x]
    assert "paused" in line and str(pid) in line, line
    listed = CliRunner().invoke(
        cli, ["local", "status", "--dir", str(fault_cluster.base_dir), "--json"]
    )
    servers = json.loads(listed.output)["servers"]
    assert [(s["running"], s["paused"]) for s in servers] == [(True, False), (False, True)]


def test_a_put_that_fails_on_one_server_says_the_others_may_be_stored(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """A batch goes to each server in parallel: with one down, ``put`` exits 1, and the
    entities of the other are stored; it used to print only ``server unavailable``."""
    store = fault_store()
    (healthy,), (sick,) = ids_on(store, 0, 1), ids_on(store, SICK, 1)
    fault_cluster.stop_server(SICK)
    lines = "".join(json.dumps({"id": k.hex(), "n": 1}) + "\n" for k in (healthy, sick))
    put = run_cli(fault_cluster, store, "put", stdin=lines)
    assert put.exit_code == 1, (put.stdout, put.stderr)
    assert fault_cluster.addresses[SICK] in put.stderr, put.stderr
    assert "on the servers that answered may be stored: put them again" in put.stderr
    assert store.get(healthy) == {"id": healthy, "n": 1}


def test_a_server_that_does_not_answer_is_named_once(
    fault_cluster: LocalCluster,
    fault_store: Callable[..., DataStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The library's "marked down" warning printed before the command's own error, in
    the same words: the CLI keeps it for long-running processes, not for a command."""
    store = fault_store()
    fault_cluster.pause_server(SICK)  # frozen: its connections time out
    sick = fault_cluster.addresses[SICK]
    health = logging.getLogger("schemaless.health")
    with caplog.at_level(logging.INFO):
        shown = run_cli(fault_cluster, store, "get", *(k.hex() for k in ids_on(store, SICK, 1)))
    assert shown.exit_code == 1 and sick in shown.stderr, (shown.stdout, shown.stderr)
    assert next(x for x in shown.stderr.splitlines() if sick in x).startswith("Error: ")
    assert not [r for r in caplog.records if r.name == "schemaless.health" and r.levelno >= 30]
    assert health.level == logging.NOTSET  # restored when the command ended


def test_feeds_trim_trims_the_shards_that_answer_and_names_the_rest(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """``feeds trim`` with a server stopped: the readers on the other server keep their
    newest row, the command exits 1 naming the shards left; it used to stop at the
    first shard of the stopped server."""
    store = fault_store(changes=True)
    home = Feeds(store, "home")
    (star, near), (far,) = ids_on(store, 0, 2), ids_on(store, SICK, 1)
    home.follow(near, star)
    home.follow(far, star)
    posts = [{"id": ids_on(store, 0, 1)[0], "n": i} for i in range(3)]
    for post in posts:
        home.post(star, post)
    assert home.work(once=True) == 3
    assert len(home.home(near)) == 3
    fault_cluster.stop_server(SICK)
    shown = run_cli(fault_cluster, store, "feeds", "trim", "home", "--keep", "1")
    assert shown.exit_code == 1, (shown.stdout, shown.stderr)
    topo = store.cluster.current()
    left = [s for s in range(topo.n_shards) if topo.shard_servers[s] == SICK]
    assert "2 inbox rows deleted on the shards that answered" in shown.stderr, shown.stderr
    assert f"logical shards {', '.join(map(str, left))} not trimmed" in shown.stderr
    assert [e["id"] for e in home.home(near)] == [posts[-1]["id"]]


def test_changes_with_a_server_down_reads_the_others_and_resumes_the_rest(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """``changes`` with a server stopped failed outright; ``--partial`` prints the
    changes of the server that answers, names the other, and its cursor resumes the
    sick server's shards from where they were: once it answers, their changes come,
    and nothing of the healthy one twice."""
    store = fault_store(changes=True)
    (healthy,), (sick,) = ids_on(store, 0, 1), ids_on(store, SICK, 1)
    store.put({"id": healthy, "n": 1})
    store.put({"id": sick, "n": 2})
    fault_cluster.stop_server(SICK)
    refused = run_cli(fault_cluster, store, "changes", "--json")
    assert refused.exit_code == 1, (refused.stdout, refused.stderr)
    assert "`--partial` reads the servers that answer" in refused.stderr, refused.stderr
    shown = run_cli(fault_cluster, store, "changes", "--json", "--partial")
    assert shown.exit_code == 0, (shown.stdout, shown.stderr)
    lines = [json.loads(x) for x in shown.stdout.splitlines()]
    assert [x["id"] for x in lines] == [healthy.hex()]
    assert fault_cluster.addresses[SICK] in shown.stderr, shown.stderr
    assert "their changes wait" in shown.stderr, shown.stderr
    assert [e.id for e in store.changes(partial=True)] == [healthy]  # the library's form
    fault_cluster.start_server(SICK)
    rest = run_cli(fault_cluster, store, "changes", "--json", "--since", lines[-1]["cursor"])
    assert rest.exit_code == 0, (rest.stdout, rest.stderr)
    assert [json.loads(x)["id"] for x in rest.stdout.splitlines()] == [sick.hex()]


def test_changes_cut_by_a_server_stopping_prints_where_to_resume(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """``changes`` (text lines carry no cursor) that a server stopping cut short printed
    only the error, so what it had shown could not be resumed from; it now prints
    ``resume with: --since CURSOR`` first, and that cursor reads nothing twice."""
    store = fault_store(changes=True)
    ids = [*ids_on(store, 0, 2), *ids_on(store, SICK, 2)]
    store.put_many([{"id": k, "n": 1} for k in ids])
    stop = iter([lambda: fault_cluster.stop_server(SICK)])
    failpoints.set("feed.after_round", lambda: next(stop, lambda: None)())
    shown = run_cli(fault_cluster, store, "changes")
    failpoints.clear("feed.after_round")
    assert shown.exit_code == 1, (shown.stdout, shown.stderr)
    assert sorted(line.split()[3] for line in shown.stdout.splitlines()) == sorted(
        k.hex() for k in ids
    )
    resume, error = shown.stderr.splitlines()
    assert resume.startswith("resume with: --since ") and error.startswith("Error: "), resume
    fault_cluster.start_server(SICK)
    store.put({"id": ids[0], "n": 2})
    rest = run_cli(fault_cluster, store, "changes", "--json", "--since", resume.split()[-1])
    assert rest.exit_code == 0, (rest.stdout, rest.stderr)
    assert [(json.loads(x)["id"], json.loads(x)["version"]) for x in rest.stdout.splitlines()] == [
        (ids[0].hex(), store.get(ids[0]).version)  # type: ignore[union-attr]
    ]


def test_init_on_a_local_cluster_with_a_server_stopped_names_it(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """``init`` (every local server) with one stopped said the local cluster "is not
    running" while ``local status`` showed the other running; it names the stopped one."""
    store = fault_store()
    fault_cluster.stop_server(SICK)
    refused = run_cli(fault_cluster, store, "init", "--prefix", "never_made", "--shards", "2")
    assert refused.exit_code == 1, (refused.stdout, refused.stderr)
    assert refused.stderr == (
        f"Error: no --url or SCHEMALESS_URL given and the local cluster ({fault_cluster.base_dir})"
        f" has server {SICK} ({fault_cluster.addresses[SICK]}) stopped (a new datastore uses"
        " every local server): run `schemaless local up`\n"
    )
    assert run_cli(fault_cluster, store, "shards").exit_code == 0  # the catalog's suffices


def test_drop_old_with_a_server_down_drops_the_others_and_names_it(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """``shards drop-old`` failed outright with a server down; it now deletes the old
    copies on the servers that answer, then exits 1 naming the other."""
    store = fault_store()
    topo = store.cluster.current()
    away, back = topo.shards_of(0)[0], topo.shards_of(SICK)[0]
    # rows in both shards: an old copy without rows is nothing to drop (40 random ids
    # left one of them empty in about one run of two hundred)
    store.put_many([{"id": k, "n": 1} for s in (away, back) for k in ids_of_shard(store, s, 3)])
    mover = ShardMover(store)
    mover.move(away, SICK)  # its old copy stays on server 0
    mover.move(back, 0)  # and this one's on the sick server
    fault_cluster.stop_server(SICK)
    dropped = run_cli(fault_cluster, store, "shards", "drop-old")
    assert dropped.exit_code == 1, (dropped.stdout, dropped.stderr)
    assert fault_cluster.addresses[SICK] in dropped.stderr, dropped.stderr
    assert "1 old copies dropped on the servers that answered" in dropped.stderr
    db = str(topo.owned_db)
    left = store.cluster.all_servers(topo)[0].run(
        admin([f"SELECT COUNT(*) FROM {quote(db, 'entities')} WHERE `shard` = {away}"])
    )
    assert left[0][0][0] == 0


def test_local_down_stops_one_server_and_up_starts_it(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """A new user trying a server down had to find a mariadbd's pid to kill;
    ``local down --server N`` stops that one alone, and ``local up`` starts it again."""
    store = fault_store()
    (healthy,), (sick,) = ids_on(store, 0, 1), ids_on(store, SICK, 1)
    base = ["--dir", str(fault_cluster.base_dir)]
    stopped = CliRunner().invoke(cli, ["local", "down", "--server", str(SICK), *base])
    assert stopped.exit_code == 0, stopped.output
    assert f"server {SICK} ({fault_cluster.addresses[SICK]}) stopped" in stopped.output
    assert [s.pid() is None for s in fault_cluster.servers] == [False, True]
    put = run_cli(fault_cluster, store, "put", stdin=json.dumps({"id": healthy.hex()}))
    assert put.exit_code == 0, put.stderr  # the other server's shards work
    assert run_cli(fault_cluster, store, "get", sick.hex()).exit_code == 1
    again = CliRunner().invoke(cli, ["local", "down", "--server", str(SICK), *base])
    assert again.exit_code == 0 and "was not running" in again.output, again.output
    refused = CliRunner().invoke(cli, ["local", "down", "--server", "2", *base])
    assert refused.exit_code == 1, refused.output
    assert "Invalid value for '--server': no server 2: the cluster has 2" in refused.output
    started = CliRunner().invoke(cli, ["local", "up", *base])
    assert started.exit_code == 0, started.output
    assert "starting 1 server in " in started.stderr, started.stderr  # it said 2, the default
    assert all(s.pid() is not None for s in fault_cluster.servers)
