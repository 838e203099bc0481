"""``cleaner --index=NAME --jobs N``: worker processes, restarts, one summary, signals."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import assert_clean, wait_until
from test_cleaner import BY_LINK
from test_cleaner_cli import building, cluster_env, spawn

from schemaless import DataStore
from schemaless.cleaner.daemon import backfill_name
from schemaless.cleaner.jobs import Supervisor, describe_exit, forwarded_options
from schemaless.cleaner.main import main, worker_args
from schemaless.local import LocalCluster

SLOW = {"SCHEMALESS_FAILPOINTS": "cleaner.after_batch=sleep(0.1)"}


def part_rows(store: DataStore, part: int, jobs: int) -> tuple[int, bool]:
    """(rows backfilled, every shard done) of one part, from the checkpoints."""
    saved = store.cluster.catalog.checkpoints("backfill:by_link")
    mine = range(part, store.cluster.topology.n_shards, jobs)
    rows = sum(saved.get(s, (0, False, 0))[2] for s in mine)
    return rows, all(saved.get(s, (0, False, 0))[1] for s in mine)


def worker_pid(store: DataStore, name: str) -> int | None:
    _, figures = store.cluster.catalog.statuses().get(name, (0, {}))
    return figures.get("pid")


def test_describe_exit() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(1) == "exit status 1"


def test_workers_get_the_options_given() -> None:
    args = ["--index", "x", "--jobs", "2", "--batch", "50", "--rate", "10", "-q", "--once"]
    ctx = main.make_context("cleaner", args)
    words = forwarded_options(ctx, {"index", "jobs", "quiet"})
    # not --interval, --nice, ...: their defaults are the workers' defaults too
    assert words == ["--once", "--batch", "50", "--rate", "10.0"]


def test_each_worker_gets_its_share_of_the_rate() -> None:
    args = ["--index", "x", "--jobs", "4", "--rate", "1000", "--batch", "50"]
    words = worker_args(main.make_context("cleaner", args), "x", 4)(2)
    assert words[words.index("--rate") + 1] == "250.0" and words.count("--rate") == 1
    assert words[-2:] == ["--part", "3/4"] and "--batch" in words
    unlimited = worker_args(main.make_context("cleaner", args[:4]), "x", 4)(0)
    assert "--rate" not in unlimited


def test_jobs_options_are_checked(make_store: Any, local_cluster: LocalCluster) -> None:
    env = cluster_env(local_cluster, make_store(indexes=[BY_LINK]))
    for args, expected in (
        (["--jobs", "2"], "needs --index"),
        (["--index", "by_link", "--jobs", "2", "--part", "1/2"], "not with --part"),
        (["--index", "by_link", "--jobs", "2", "--metrics-port", "0"], "not with --metrics-port"),
        (["--index", "by_link", "--jobs", "0"], "--jobs"),
    ):
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == 1 and expected in result.output, result.output
    result = CliRunner().invoke(main, ["--index", "nope", "--jobs", "2"], env=env)
    assert result.exit_code == 1 and "Error: no index named 'nope' (indexes: " in result.output


def test_jobs_3_with_a_worker_sigkilled_ends_ready(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    store, env = building(make_store, local_cluster, 3000)
    out = tmp_path / "cleaner.log"
    proc = spawn(env, out, "--index", "by_link", "--jobs", "3", "--batch", "50", **SLOW)
    try:
        # part 2/3 mid-way: its heartbeat names its pid, its checkpoints have moved
        pid = wait_until(lambda: worker_pid(store, "backfill:by_link:2/3"))
        wait_until(lambda: part_rows(store, 1, 3)[0] > 0)
        _, done = part_rows(store, 1, 3)
        assert not done, "the part ended before the kill: make the data bigger"
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=120) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert f"part 2/3 (pid {pid}) killed by SIGKILL; starting it again" in text, text
    assert "progress: by_link: 3,000/~3,000 rows" in text  # the one display, all parts
    summary = [line for line in text.splitlines() if line.startswith("backfill:by_link")]
    assert len(summary) == 1 and "(3 jobs): ready after" in summary[0], text
    assert "restarts 1" in summary[0] and "part 1/3 done" not in text
    assert summary[0].endswith("; checkpoints: 3,000 rows, shards 8/8 done")
    assert worker_pid(store, "backfill:by_link:2/3") != pid  # a new worker finished it
    saved = store.cluster.catalog.checkpoints("backfill:by_link")
    assert len(saved) == 8 and all(done for _, done, _ in saved.values())
    assert sum(n for _, _, n in saved.values()) == 3000  # each entity counted once
    assert store.cluster.refresh().indexes["by_link"].state == "ready"
    assert_clean(store)


def test_sigterm_stops_every_worker_at_a_checkpoint(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    store, env = building(make_store, local_cluster, 2000)
    out = tmp_path / "cleaner.log"
    proc = spawn(env, out, "--index", "by_link", "--jobs", "2", "--batch", "50", **SLOW)
    try:
        wait_until(lambda: part_rows(store, 0, 2)[0] and part_rows(store, 1, 2)[0])
        pids = [worker_pid(store, f"backfill:by_link:{k}/2") for k in (1, 2)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert "stopped on request; checkpoints saved" in text and "Traceback" not in text
    for pid in pids:  # the workers are gone, and stopped the graceful way
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    states = [store.cluster.catalog.statuses()[f"backfill:by_link:{k}/2"][1] for k in (1, 2)]
    assert [s["state"] for s in states] == ["stopped", "stopped"]
    assert store.cluster.refresh().indexes["by_link"].state == "building"
    # the same command resumes and finishes
    proc = spawn(env, out, "--index", "by_link", "--jobs", "2", "--quiet")
    assert proc.wait(timeout=120) == 0, out.read_text()
    assert sum(n for _, _, n in store.cluster.catalog.checkpoints("backfill:by_link").values()) == (
        2000
    )
    assert_clean(store)


def test_a_worker_that_keeps_dying_is_reported(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store, env = building(make_store, local_cluster, 400)
    dying = {**os.environ, **env, "SCHEMALESS_FAILPOINTS": "cleaner.after_batch=kill"}
    supervisor = Supervisor(
        store,
        "by_link",
        2,
        lambda k: ["--index", "by_link", "--part", f"{k + 1}/2", "--batch", "10", "--quiet"],
        env=dying,
        restarts=1,
        restart_delay=0.05,
    )
    assert supervisor.run() == "building"
    assert supervisor.failed == [
        "part 1/2: killed by SIGKILL after 1 restarts",
        "part 2/2: killed by SIGKILL after 1 restarts",
    ]
    assert "(2 jobs): building after" in supervisor.summary()
    assert "restarts 2" in supervisor.summary()
    # each run committed one batch (of 10: the shards hold ~50) or one per lane (2
    # servers) before dying, and the restart resumed after them
    for part in (0, 1):
        assert 2 * 10 <= part_rows(store, part, 2)[0] <= 4 * 10


def test_the_summary_adds_up_what_held_each_worker_back(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store, _ = building(make_store, local_cluster, 10)
    supervisor = Supervisor(store, "by_link", 2, lambda k: [])
    catalog = store.cluster.catalog
    for w, held in zip(supervisor.workers, (3.0, 4.5), strict=True):
        name = backfill_name("by_link", (w.part, 2))
        catalog.heartbeat(name, {"pid": 100 + w.part, "throttled_canary_s": held})
        supervisor._collect(w, 100 + w.part, finished=True)  # as after its exit
    catalog.heartbeat("backfill:by_link:1/2", {"pid": 200, "throttled_clients_s": 1.0})
    supervisor._collect(supervisor.workers[0], 200, finished=True)  # a restarted run
    assert "workers throttled 8.5s (canary 7.5s, clients' p99 1.0s)" in supervisor.summary()
