"""``index status`` of a backfill whose Cleaner stopped: no rate, no ETA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from conftest import REPO
from test_cli import Cli, cluster_env, drop_prefix

from schemaless.cli.stats import ShardProgress, added_ranges, backfill
from schemaless.connect import open_store
from schemaless.local import LocalCluster
from schemaless.names import quote


def test_a_stopped_or_silent_cleaner_shows_no_rate_and_no_eta(local_cluster: LocalCluster) -> None:
    prefix = "st_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        run.ok("init", "--shards", "2")
        run.ok("put", input="".join(json.dumps({"title": f"t{i}"}) + "\n" for i in range(5)))
        run.ok("index", "create", "by_t", "--property", "title:str(16)")
        with open_store(prefix=prefix, local_dir=str(local_cluster.base_dir)) as ds:
            cat = ds.cluster.catalog
            figures = {"index": "by_t", "rows_per_s": 250}

            def status() -> str:
                out = run.ok("index", "status", "by_t").output
                assert "index by_t: building" in out
                return out

            cat.heartbeat("backfill:by_t", {**figures, "state": "backfilling"})
            assert "rate 250 rows/s (from backfill:by_t's heartbeat), ETA " in status()

            cat.heartbeat("backfill:by_t", {**figures, "state": "stopped"})
            out = status()
            assert "no Cleaner at work: backfill:by_t stopped, last seen " in out
            assert "rate 250 rows/s" not in out and ", ETA " not in out
            report = json.loads(run.ok("index", "status", "by_t", "--json").output)
            assert report["backfill"]["rows_per_s"] is None and report["backfill"]["eta_s"] is None
            assert report["backfill"]["stopped"].startswith("backfill:by_t stopped")

            # killed: its last heartbeat says backfilling, a minute ago
            cat.heartbeat("backfill:by_t", {**figures, "state": "backfilling"})
            table = quote(f"{prefix}_catalog", "status")
            cat.server.run(f"UPDATE {table} SET heartbeat = heartbeat - 60000000")
            out = status()
            assert "no Cleaner at work: backfill:by_t silent, last seen 1m" in out
            assert "rate 250 rows/s" not in out and ", ETA " not in out
    finally:
        drop_prefix(local_cluster, prefix)


def test_make_local_status_prints_readable_lines(local_cluster: LocalCluster) -> None:
    venv = Path(sys.prefix)
    done = subprocess.run(
        ["make", "-s", "-o", f"{venv}/.installed", f"VENV={venv}", "local-status"],
        cwd=REPO,
        env={**os.environ, "SCHEMALESS_LOCAL_DIR": str(local_cluster.base_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"local cluster in {local_cluster.base_dir}: ")
    assert lines[1].split() == ["server", "address", "running", "pid", "data"]
    assert lines[3].split()[:3] == ["0", local_cluster.servers[0].address, "yes"]
    assert "{" not in done.stdout and "'running'" not in done.stdout


def test_backfill_progress_counts_from_where_each_shard_starts(local_cluster: LocalCluster) -> None:
    """In the owned layout ``added_id`` counts a server's rows, so a shard's rows start
    past 0: its progress is measured over its own range (an unscanned shard is at 0%,
    not at the share of the server's rows before it), in the old layout from 0."""
    prefix = "rng_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        run.ok("init", "--shards", "4")  # two shards a server, sharing its counter
        for _ in range(3):  # batches: each shard's rows interleave with its neighbour's
            run.ok("put", input="".join(json.dumps({"n": i}) + "\n" for i in range(20)))
        with open_store(prefix=prefix, local_dir=str(local_cluster.base_dir)) as ds:
            topo = ds.cluster.refresh()
            ranges = added_ranges(ds, topo)
            assert all(r is not None and r[1] > r[0] for r in ranges.values())
            later = max(range(4), key=lambda s: ranges[s][0])  # type: ignore[index]
            before, top, _ = ranges[later]  # type: ignore[misc]
            assert before > 0  # behind the other shard's first rows
            snap = backfill(ds, "by_nothing", ranges)
            assert snap.fraction == 0.0 and snap.scanned == 0
            half = ShardProgress(
                later, "s", before + (top - before) // 2, top, False, 0, None, before
            )
            assert half.fraction is not None and 0.4 < half.fraction < 0.6
            assert half.remaining == top - half.position and half.scanned == half.position - before
    finally:
        drop_prefix(local_cluster, prefix)


def test_the_eta_from_a_heartbeat_counts_rows_not_shared_counter_values(
    local_cluster: LocalCluster,
) -> None:
    """In the owned layout the shards of a server share its ``added_id`` counter, so a
    shard's range spans its neighbours' rows too: the rows left (and the ETA from a
    Cleaner's rows/s) are those values times the server's rows per value, not the
    values themselves (4x too many here, with four shards a server): as the Cleaner's
    own progress line counts them."""
    prefix = "eta_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        run.ok("init", "--shards", "8")
        for _ in range(4):  # batches: each shard's rows interleave with its neighbours'
            run.ok("put", input="".join(json.dumps({"n": i}) + "\n" for i in range(100)))
        run.ok("index", "create", "by_n", "--property", "n:int")
        with open_store(prefix=prefix, local_dir=str(local_cluster.base_dir)) as ds:
            snap = backfill(ds, "by_n")
            assert snap.remaining is not None and snap.remaining > 2 * 400  # values
            assert snap.remaining_rows is not None and 300 <= snap.remaining_rows <= 500
            figures = {"index": "by_n", "rows_per_s": 100, "state": "backfilling"}
            ds.cluster.catalog.heartbeat("backfill:by_n", figures)
            report = json.loads(run.ok("index", "status", "by_n", "--json").output)["backfill"]
            assert 300 <= report["remaining_rows"] <= 500
            assert report["eta_s"] == report["remaining_rows"] / 100
    finally:
        drop_prefix(local_cluster, prefix)
