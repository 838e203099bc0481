"""``schemaless shards move|rebalance|rollback|drop-old``, ``servers``, ``replicas``,
``dictionary``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from test_cli import Cli, cluster_env, drop_prefix

from schemaless import failpoints
from schemaless.local import LocalCluster


@pytest.fixture
def run(local_cluster: LocalCluster) -> Iterator[Cli]:
    prefix = "clitopo_" + uuid.uuid4().hex[:8]
    cli_ = Cli(cluster_env(local_cluster, prefix))
    try:
        cli_.ok("init", "--shards", "4")
        entities = "\n".join(
            json.dumps({"n": i, "text": f"entry number {i} " * 3}) for i in range(400)
        )
        cli_.ok("put", input=entities)
        yield cli_
    finally:
        drop_prefix(local_cluster, prefix)


def shard_servers(run: Cli) -> dict[int, str]:
    out = run.ok("shards", "--per-shard", "--json").output
    return {
        s["shard"]: server["address"]
        for server in map(json.loads, out.splitlines())
        for s in server["per_shard"]
    }


def test_move_rebalance_and_drop_old(run: Cli, local_cluster: LocalCluster) -> None:
    a, b = local_cluster.addresses
    before = shard_servers(run)
    other = b if before[0] == a else a
    assert "would move shard 0" in run.ok("shards", "move", "0", "--to", other, "--dry-run").output
    assert shard_servers(run) == before
    out = run.ok("shards", "move", "0", "--to", other).output
    assert "verified: entities" in out and "writes paused" in out
    after = shard_servers(run)
    assert after[0] == other and {k: v for k, v in after.items() if k} == {
        k: v for k, v in before.items() if k
    }
    again = run.ok("shards", "move", "0", "--to", other).output  # it added "a -> a; 0 rows"
    assert again == f"shard 0 already on {other}\n", again
    assert "1 moves planned (dry run)" in run.ok("shards", "rebalance", "--dry-run").output
    run.ok("shards", "rebalance")
    counts = list(shard_servers(run).values())
    assert sorted(counts.count(x) for x in (a, b)) == [2, 2]
    dropped = run.ok("shards", "drop-old", "--chunk", "50", "--pause", "0").output
    assert dropped.count("dropped") == 2 and "shard 0 (" in dropped  # moved away, and back
    assert "no old copies" in run.ok("shards", "drop-old").output
    assert "--pause" in run.fails("shards", "drop-old", "--pause", "-1")
    rows = run.ok("shards", "--json").output
    assert sum(json.loads(line)["live"] for line in rows.splitlines()) == 400


def test_bad_move_targets_name_the_option(run: Cli) -> None:
    assert "--to" in run.fails("shards", "move", "0", "--to", "10.9.9.9:1")
    past = "Error: Invalid value for 'SHARD': no logical shard 99: there are 4 (0 to 3)"
    assert run.fails("shards", "move", "99", "--to", "0") == past  # was untyped, unlike -12
    assert run.fails("shards", "rollback", "99") == past
    # a negative shard was click's usage error (exit 2: "No such option '-1'")
    negative = "Error: Invalid value for 'SHARD': no logical shard -12: they are numbered from 0"
    assert run.fails("shards", "move", "-12", "--to", "0") == negative
    assert run.fails("shards", "rollback", "-12") == negative
    unknown = run("shards", "move", "0", "--to", "0", "--bogus")
    assert unknown.exit_code == 2 and "No such option '--bogus'" in unknown.stderr, unknown.stderr


def test_servers_replicas_and_dictionary(run: Cli, local_cluster: LocalCluster) -> None:
    a, b = local_cluster.addresses
    listing = run.ok("servers", "list").output
    assert a in listing and b in listing and "replicas: none" in listing
    assert "not replicating yet" in run.ok("replicas", "add", "0", b).output
    assert f"replicas: {b}" in run.ok("servers", "list").output
    run.ok("replicas", "remove", "0", b)
    # a typo or a second remove printed "removed", exit 0 (found in a new user's trial)
    again = run.fails("replicas", "remove", "0", b)
    assert again == f"Error: {b} is not a replica of server 0 (its replicas: none): nothing removed"
    for verb in ("add", "remove"):  # named --to, an option of shards move
        refused = run.fails("replicas", verb, "9", b)
        assert refused.startswith("Error: Invalid value for 'SERVER': unknown server '9'"), refused
    assert f"replicas: {b}" not in run.ok("servers", "list").output
    assert "trained and active" in run.ok("dictionary", "train", "--samples", "400").output
    assert run.ok("servers", "add", a).output.startswith("server 0 =")  # already known


def test_rollback_says_what_it_undid(run: Cli, local_cluster: LocalCluster) -> None:
    """``shards rollback`` printed ``no move in progress`` even after undoing an
    interrupted move, and took a shard number out of range (found in a new user's trial)."""
    before = shard_servers(run)
    other = next(a for a in local_cluster.addresses if a != before[1])
    failpoints.set("move.after_fence", "raise")
    try:
        with pytest.raises(failpoints.FailpointError):
            run("shards", "move", "1", "--to", other)
    finally:
        failpoints.clear("move.after_fence")
    shown = run.ok("shards", "--per-shard")
    warned = shown.stderr
    assert f"warning: shard 1: move {before[1]} -> {other} unfinished (" in warned, warned
    refused = run.fails("shards", "rebalance", "--dry-run")  # it planned around the move
    assert "finish or undo the unfinished moves first: shard 1: move" in refused, refused
    # the fenced shard's server answers for its other shards (it showed them all unknown
    # and called the server unreachable)
    assert "unreachable" not in warned, warned
    rows = {line.split()[0]: line for line in shown.output.splitlines()[1:] if line.split()}
    same = next(s for s, at in before.items() if at == before[1] and s != 1)
    assert "unknown" in rows["1"] and "unknown" not in rows[str(same)], shown.output
    assert "`schemaless shards rollback 1` undoes it" in warned, warned
    undone = run.ok("shards", "rollback", "1").output
    assert undone == f"shard 1: move to {other} rolled back; on {before[1]} again\n", undone
    assert shard_servers(run) == before
    assert "unfinished" not in run.ok("shards").stderr
    assert run.ok("shards", "rollback", "1").output == "shard 1: no move in progress\n"
    assert "no logical shard 4: there are 4" in run.fails("shards", "rollback", "4")
