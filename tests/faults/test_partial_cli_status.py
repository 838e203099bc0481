"""CLI status commands with one server of two stopped (found in a new user's trial):
they show what the servers that answer hold and name the other, as ``shards`` does."""

from __future__ import annotations

import json
from collections.abc import Callable

from click.testing import CliRunner, Result

from schemaless import DataStore
from schemaless.cli.main import cli
from schemaless.local import LocalCluster
from schemaless.subscriptions import feed_status

SICK = 1  # server 0 holds the catalog


def _cli(cluster: LocalCluster, store: DataStore, *args: str) -> Result:
    env = {
        "SCHEMALESS_LOCAL_DIR": str(cluster.base_dir),
        "SCHEMALESS_PREFIX": store.cluster.topology.prefix,
        "SCHEMALESS_URL": None,
        "SCHEMALESS_USER": None,
        "SCHEMALESS_PASSWORD": None,
        "SCHEMALESS_OPTION_FILE": None,
    }
    return CliRunner(env=env).invoke(cli, list(args), catch_exceptions=False)


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
    shown = _cli(fault_cluster, store, "changes", "--status")
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
