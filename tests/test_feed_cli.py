"""``schemaless init --changes`` and ``schemaless changes`` (--json, --since, --status)."""

from __future__ import annotations

import json
import uuid

from test_cli import Cli, cluster_env, drop_prefix

from schemaless import DataStore
from schemaless.local import LocalCluster


def test_changes_json_since_and_status(local_cluster: LocalCluster) -> None:
    prefix = "feedcli_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        out = run.ok("init", "--shards", "4", "--changes").output
        assert "change feed on" in out
        assert "already exists" in run.ok("init", "--changes").output
        empty = run.ok("changes")  # printed nothing at all: no cursor, no sign it ran
        assert empty.stdout == "" and empty.stderr.startswith("resume with: --since c1.")
        start = empty.stderr.split()[-1]
        run.ok("put", input='{"name": "ada"}\n{"name": "bob"}\n')
        assert len(run.ok("changes", "--since", start).stdout.splitlines()) == 2
        lines = [json.loads(x) for x in run.ok("changes", "--json").output.splitlines()]
        assert [x["op"] for x in lines] == ["put", "put"]
        assert {x["entity"]["name"] for x in lines} == {"ada", "bob"}
        ada = next(x for x in lines if x["entity"]["name"] == "ada")
        run.ok("delete", ada["id"])
        since = run.ok("changes", "--json", "--since", lines[-1]["cursor"]).output.splitlines()
        (deleted,) = [json.loads(x) for x in since]
        assert deleted["op"] == "delete" and deleted["id"] == ada["id"]
        assert deleted["entity"] is None and deleted["version"] > ada["version"]
        text = run.ok("changes", "--since", lines[-1]["cursor"])
        assert f"delete    {ada['id']}" in text.stdout
        assert text.stderr.startswith("resume with: --since c1.")
        snapshot = run.ok("changes", "--snapshot", "--json").output
        snap = [json.loads(x) for x in snapshot.splitlines()]
        assert [(x["op"], x["entity"]["name"]) for x in snap] == [("snapshot", "bob")]
        assert "--since" in run.fails("changes", "--since", "nonsense")
        assert "no subscriptions" in run.ok("changes", "--status").output
        with _opened(local_cluster, prefix) as ds:
            sub = ds.subscribe("indexer")
            sub.ack(next(iter(sub.changes())))
        status = json.loads(run.ok("changes", "--status", "--json").output)
        assert (status["name"], status["shards"], status["behind"]) == ("indexer", 4, 2)
        assert "indexer" in run.ok("changes", "--status").output
        out = run.ok("changes", "--unsubscribe", "indexer").output
        assert "4 positions forgotten" in out
        again = run.fails("changes", "--unsubscribe", "indexer")  # it said 0 forgotten, exit 0
        assert "no subscription 'indexer': nothing forgotten" in again
        assert "no subscriptions" in run.ok("changes", "--status").output
    finally:
        drop_prefix(local_cluster, prefix)


def _opened(local_cluster: LocalCluster, prefix: str) -> DataStore:
    """The datastore the CLI made."""
    return DataStore(
        local_cluster.addresses,
        option_file=str(local_cluster.option_file),
        prefix=prefix,
        create=False,
    )


def test_changes_refused_when_the_feed_is_off(local_cluster: LocalCluster) -> None:
    prefix = "feedoff_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        run.ok("init", "--shards", "2")
        refused = run.fails("changes")  # it named only the library's changes=True
        assert "change feed is off" in refused and "`schemaless init --changes`" in refused
        run.ok("init", "--changes")
        on = run.ok("changes")
        assert on.stdout == "" and on.stderr.startswith("resume with: --since c1.")
    finally:
        drop_prefix(local_cluster, prefix)


def test_status_and_unsubscribe_refuse_the_streams_options(local_cluster: LocalCluster) -> None:
    """``changes --status --partial`` (or ``--since``, ``--follow``...) ignored the
    stream's option; ``--unsubscribe`` too: each is refused, naming it, nothing forgotten
    (found in a new user's trial)."""
    prefix = "feedalone_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        run.ok("init", "--shards", "2", "--changes")
        with _opened(local_cluster, prefix) as ds:
            ds.subscribe("indexer")
        assert run.fails("changes", "--status", "--partial") == (
            "Error: Invalid value for '--partial': not with --status, which shows a server"
            " that does not answer as unknown"
        )
        for extra in (["--follow"], ["--since", "x"], ["--snapshot"], ["--part", "1/2"]):
            assert f"'{extra[0]}': not with --status" in run.fails("changes", "--status", *extra)
        for extra in (["--status"], ["--json"], ["--partial"]):
            refused = run.fails("changes", "--unsubscribe", "indexer", *extra)
            assert f"'{extra[0]}': not with --unsubscribe" in refused, refused
        assert "indexer" in run.ok("changes", "--status").output  # still subscribed
    finally:
        drop_prefix(local_cluster, prefix)
