"""The ``cleaner`` command against the real local cluster: CliRunner for the commands,
subprocesses for SIGKILL and SIGTERM."""

from __future__ import annotations

import configparser
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import wait_until
from test_cleaner import BY_LINK, _delete_row, _set_version, load, plant

from schemaless import DataStore, Index
from schemaless.cleaner import diff_indexes
from schemaless.cleaner.main import main
from schemaless.ids import id_hex, new_id
from schemaless.local import LocalCluster


def cluster_env(cluster: LocalCluster, store: DataStore) -> dict[str, str]:
    """Production-style settings: the catalog server's URL, the prefix, and the
    application user's credentials in the environment."""
    parser = configparser.ConfigParser()
    parser.read(cluster.option_file)
    return {
        "SCHEMALESS_URL": f"mysql://{cluster.addresses[0]}",
        "SCHEMALESS_PREFIX": store.cluster.topology.prefix,
        "SCHEMALESS_USER": parser["client"]["user"],
        "SCHEMALESS_PASSWORD": parser["client"]["password"],
    }


def building(
    make_store: Callable[..., DataStore], cluster: LocalCluster, entities: int
) -> tuple[DataStore, dict[str, str]]:
    """A datastore with ``entities`` loaded and BY_LINK declared (building); its env."""
    store = make_store()
    load(store, entities)
    store.declare_index(BY_LINK)
    return store, cluster_env(cluster, store)


def invoke(env: Mapping[str, str | None], *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def spawn(env: dict[str, str], out: Path, *args: str, **extra: str) -> subprocess.Popen[bytes]:
    """The cleaner in its own process; stdout and stderr to ``out``."""
    with open(out, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "schemaless.cleaner.main", *args],
            env={**os.environ, **env, **extra},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


# -- the command line --------------------------------------------------------------------


def test_every_command_has_help_with_an_example() -> None:
    for args in (["--help"], ["verify", "--help"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert "Example" in result.output and "cleaner" in result.output


def test_bad_options_name_the_option(make_store: Any, local_cluster: LocalCluster) -> None:
    result = CliRunner().invoke(main, ["--batch", "0"])
    assert result.exit_code == 1 and "--batch" in result.output
    result = CliRunner().invoke(main, ["--rate", "-5"])
    assert result.exit_code == 1 and "--rate" in result.output
    for option, bad in (("--tombstone-retention", "nan"), ("--feed-retention", "inf")):
        result = CliRunner().invoke(main, ["--once", option, bad])  # were tracebacks
        assert result.exit_code == 1 and f"'{option}': {bad!r} is not a finite" in result.output
    env = cluster_env(local_cluster, make_store(indexes=[BY_LINK]))
    result = CliRunner().invoke(main, ["verify", "--index", "nope"], env=env)
    assert result.exit_code == 1 and "--index" in result.output
    assert "(indexes: by_link)" in result.output


def test_errors_are_one_clear_line(make_store: Any, local_cluster: LocalCluster) -> None:
    store = make_store(indexes=[BY_LINK])
    env = cluster_env(local_cluster, store)
    result = CliRunner().invoke(main, ["--index", "nope"], env=env)
    assert result.exit_code == 1
    assert "Error: Invalid value for '--index': no index named 'nope' (indexes: by_link)" in (
        result.output
    )
    assert "backfill:nope" not in store.cluster.catalog.statuses()  # `index status` showed it
    assert "Traceback" not in result.output
    result = CliRunner().invoke(main, ["--once"], env={**env, "SCHEMALESS_PREFIX": "absent_x"})
    assert result.exit_code == 1 and "Error:" in result.output
    assert env["SCHEMALESS_PASSWORD"] not in result.output


def test_connection_options_are_the_clis(make_store: Any, local_cluster: LocalCluster) -> None:
    env = cluster_env(local_cluster, make_store())
    for args, extra in (
        (["--prefix", "Bad-Prefix", "--once"], {}),
        (["verify", "--prefix", "x;y"], {}),
        (["--once"], {"SCHEMALESS_PREFIX": "Bad-Prefix"}),
    ):
        result = CliRunner().invoke(main, args, env={**env, **extra})
        assert result.exit_code == 1, result.output
        assert "Error: Invalid value for '--prefix'" in result.output
        assert "Traceback" not in result.output
    url = "mysql://someone:s3cret-pw@127.0.0.1:1"  # nothing listens on port 1
    result = CliRunner().invoke(main, ["--url", url, "--once"], env={**env, "SCHEMALESS_URL": None})
    assert result.exit_code == 1 and "Error:" in result.output
    assert "s3cret-pw" not in result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert error.startswith("Error: cannot open datastore ") and "server 127.0.0.1:1 " in error
    help_text = CliRunner().invoke(main, ["--help"]).output
    assert "SCHEMALESS_URL" in help_text and "SCHEMALESS_PREFIX" in help_text


# -- verify ----------------------------------------------------------------------------


def test_verify_finds_planted_corruption_and_repairs_it(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store = make_store(indexes=[BY_LINK])
    ids = load(store, 100)
    topo = store.cluster.refresh()
    stranger = new_id()
    plant(store, BY_LINK, ("http://nobody",), stranger, 5)  # extra: no such entity
    _delete_row(store, topo, BY_LINK, ("http://example.com/1",), ids[1])  # missing
    _set_version(store, topo, BY_LINK, ("http://example.com/2",), ids[2], 1)  # behind
    env = cluster_env(local_cluster, store)

    result = invoke(env, "verify")
    assert result.exit_code == 1, result.output
    assert "index by_link: 3 differences (missing 1, extra 1, behind 1)" in result.output
    for key in (stranger, ids[1], ids[2]):
        assert id_hex(key) in result.output
    assert "row version 1 < entity version" in result.output
    assert "{'link': 'http://nobody'}: row version 5" in result.output  # by property

    result = invoke(env, "verify", "--index", "by_link", "--repair")
    assert result.exit_code == 0, result.output
    assert "1 entities fenced" in result.output and "after repair: clean" in result.output
    result = invoke(env, "verify")
    assert result.exit_code == 0 and "index by_link: clean" in result.output
    # the group's options apply to the subcommand
    prefix = env["SCHEMALESS_PREFIX"]
    result = invoke({**env, "SCHEMALESS_PREFIX": None}, "--prefix", prefix, "verify")
    assert result.exit_code == 0 and "index by_link: clean" in result.output
    assert store.put({"id": stranger, "link": "http://somebody"}) > 5  # above the fence


# -- backfill and passes through the command --------------------------------------------


def test_backfill_command_progress_summary_and_heartbeat(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store, env = building(make_store, local_cluster, 500)
    result = invoke(env, "--index", "by_link", "--batch", "100")
    assert result.exit_code == 0, result.output
    assert "waiting" in result.output  # the grace period
    assert "progress: by_link: 500/~500 rows" in result.output
    assert "backfill:by_link: done after" in result.output
    assert "rows backfilled 500" in result.output and "rows/s" in result.output
    _, figures = store.cluster.catalog.statuses()["backfill:by_link"]
    assert figures["state"] == "done" and figures["rows_backfilled"] == 500
    assert figures["index"] == "by_link" and figures["rows_per_s"] > 0
    assert store.cluster.refresh().indexes["by_link"].state == "ready"

    result = invoke(env, "--once", "--batch", "100")
    assert result.exit_code == 0, result.output
    name = f"cleaner:{socket.gethostname()}:{os.getpid()}"
    assert f"{name}: idle after" in result.output
    _, figures = store.cluster.catalog.statuses()[name]
    assert figures["passes"] == 1 and figures["rows_checked"] >= 1000
    assert figures["last_pass"] > 0 and figures["backlog"] >= 0


def test_parts_share_one_backfill_and_the_last_marks_it_ready(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    store, env = building(make_store, local_cluster, 1500)
    result = invoke(env, "--index", "by_link", "--part", "1/2", "--batch", "100")
    assert result.exit_code == 0, result.output
    assert "part 1/2 done" in result.output
    assert "index 'by_link': part 1/2 done; other parts still running" in result.output
    assert store.cluster.refresh().indexes["by_link"].state == "building"
    done = store.cluster.catalog.checkpoints("backfill:by_link")
    assert sorted(done) == [0, 2, 4, 6] and all(d for _, d, _ in done.values())
    _, figures = store.cluster.catalog.statuses()["backfill:by_link:1/2"]
    assert figures["state"] == "done"
    # two processes at once: part 1 again (nothing left) and part 2
    out = tmp_path / "parts.log"
    procs = [spawn(env, out, "--index", "by_link", "--part", p, "--quiet") for p in ("2/2", "1/2")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0], out.read_text()
    assert store.cluster.refresh().indexes["by_link"].state == "ready"
    diff = diff_indexes(store, ["by_link"])["by_link"]
    assert diff.clean
    assert sum(1 for _ in store.iter(BY_LINK)) == 1500


def test_part_is_checked(make_store: Any, local_cluster: LocalCluster) -> None:
    env = cluster_env(local_cluster, make_store(indexes=[BY_LINK]))
    for bad in ("0/2", "3/2", "x", "1/0"):
        result = CliRunner().invoke(main, ["--index", "by_link", "--part", bad], env=env)
        assert result.exit_code == 1 and "--part" in result.output, result.output
    result = CliRunner().invoke(main, ["--once", "--part", "1/2"], env=env)
    assert result.exit_code == 1 and "needs --index" in result.output


# -- signals and kills (subprocesses) -----------------------------------------------------


def test_sigkill_during_backfill_then_resume(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    store, env = building(make_store, local_cluster, 3000)
    slow = {"SCHEMALESS_FAILPOINTS": "cleaner.after_batch=sleep(0.05)"}
    catalog = store.cluster.catalog
    seen: dict[int, tuple[int, bool, int]] = {}
    rnd = random.Random(4)

    def sample() -> dict[int, tuple[int, bool, int]]:
        now = catalog.checkpoints("backfill:by_link")
        for shard, (position, done, _) in now.items():
            before = seen.get(shard, (0, False, 0))
            assert position >= before[0], f"shard {shard} moved back"
            assert done or not before[1], f"shard {shard} was done, now is not"
        seen.update(now)
        return now

    def ended_or_progressed(proc: subprocess.Popen[bytes], start: int) -> bool:
        return proc.poll() is not None or sum(n for *_, n in sample().values()) > start

    kills = 0
    out = tmp_path / "cleaner.log"
    while kills < 3:
        proc = spawn(env, out, "--index", "by_link", "--batch", "50", **slow)
        start = sum(n for _, _, n in seen.values())
        # kill at a random moment once this run has made some progress
        wait_until(partial(ended_or_progressed, proc, start))
        time.sleep(rnd.uniform(0, 0.3))
        if proc.poll() is not None:
            break
        proc.kill()
        proc.wait()
        kills += 1
        sample()
    proc = spawn(env, out, "--index", "by_link", "--batch", "50")
    assert proc.wait(timeout=60) == 0, out.read_text()
    final = sample()
    assert kills >= 2
    assert len(final) == 8 and all(done for _, done, _ in final.values())
    assert sum(n for _, _, n in final.values()) == 3000  # each entity counted once
    assert store.cluster.refresh().indexes["by_link"].state == "ready"
    assert all(d.clean for d in diff_indexes(store).values())


def test_sigterm_checkpoints_and_exits_zero(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    store = make_store(indexes=[BY_LINK])
    load(store, 200)
    env = cluster_env(local_cluster, store)
    out = tmp_path / "cleaner.log"
    proc = spawn(env, out, "--interval", "0.2", "--batch", "50")
    try:

        def passed() -> bool:
            statuses = store.cluster.catalog.statuses()
            return any(
                n.startswith("cleaner:") and f["passes"] >= 1 for n, (_, f) in statuses.items()
            )

        wait_until(passed)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert "stopped on request" in text and "Traceback" not in text
    name = f"cleaner:{socket.gethostname()}:{proc.pid}"
    _, figures = store.cluster.catalog.statuses()[name]
    assert figures["state"] == "stopped"
    assert len(store.cluster.catalog.checkpoints("recent")) == 8


def test_sigterm_during_once_finishes_the_batch(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    store = make_store(indexes=[BY_LINK])
    load(store, 20)
    env = cluster_env(local_cluster, store)
    out = tmp_path / "cleaner.log"
    proc = spawn(env, out, "--once", SCHEMALESS_FAILPOINTS="cleaner.after_read=sleep(1)")
    try:
        name = f"cleaner:{socket.gethostname()}:{proc.pid}"
        wait_until(lambda: name in store.cluster.catalog.statuses())
        time.sleep(0.5)  # inside the first (slow) batch
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert "stopped on request" in text and "Traceback" not in text
    assert store.cluster.catalog.statuses()[name][1]["state"] == "stopped"
    assert store.cluster.catalog.checkpoints("recent")  # the batch it finished


def test_second_signal_stops_at_once(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    store = make_store(indexes=[Index("by_n", {"n": "int"})])
    load(store, 20)
    env = cluster_env(local_cluster, store)
    out = tmp_path / "cleaner.log"
    proc = spawn(env, out, "--once", SCHEMALESS_FAILPOINTS="cleaner.after_read=sleep(30)")
    try:
        name = f"cleaner:{socket.gethostname()}:{proc.pid}"
        wait_until(lambda: name in store.cluster.catalog.statuses())
        time.sleep(0.5)  # in the middle of a (very slow) batch
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert proc.poll() is None  # the first signal waits for the batch
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("args", [["--once"], ["verify"]])
def test_commands_against_an_empty_datastore(
    make_store: Any, local_cluster: LocalCluster, args: list[str]
) -> None:
    env = cluster_env(local_cluster, make_store())
    result = invoke(env, *args)
    assert result.exit_code == 0, result.output
