"""The Cleaner's adaptive throttle against real servers: a slow server drops the rate
and the status says why; the rate climbs again after; critical load pauses."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import MySQLdb
import pytest
from click.testing import CliRunner
from conftest import assert_clean, wait_until
from test_cleaner import BY_LINK, entity_keys, load
from test_cleaner_cli import building, cluster_env, invoke

from schemaless import DataStore
from schemaless.cleaner.aimd import Tuning
from schemaless.cleaner.daemon import Cleaner, backfill_name
from schemaless.cleaner.main import main
from schemaless.cleaner.runtime import Stopped
from schemaless.cleaner.throttler import Throttler, ThrottleSettings
from schemaless.cli.main import cli
from schemaless.local import LocalCluster
from schemaless.schema import canary_db

#: thresholds that only a held lock or piled-up sessions can reach on a busy machine
#: no slow start: the tests below watch a limit appear and move
QUIET = ThrottleSettings(
    max_latency_ms=400.0, max_load={}, critical_load={}, tuning=Tuning(start=None)
)


@contextmanager
def copying(cleaner: Cleaner) -> Iterator[Throttler]:
    """The throttle started and a stand-in copy loop asking it before every 'batch'."""
    throttler = cleaner.throttler
    assert throttler is not None
    throttler.start(cleaner.name)

    def copy() -> None:  # as a job: a batch, then the throttle, until a stop is asked
        try:
            while not cleaner.rt.stopping:
                cleaner.rt.throttle(50)
                time.sleep(0.002)
        except Stopped:
            pass

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    try:
        wait_until(lambda: throttler.aimd.peak > 0, timeout=30)
        yield throttler
    finally:
        cleaner.shutdown.request()
        thread.join()
        cleaner.close()


def connect(cluster: LocalCluster, sid: int) -> Any:
    return MySQLdb.connect(
        host="127.0.0.1",
        port=cluster.servers[sid].port,
        read_default_file=str(cluster.option_file),
        read_default_group="client",
        autocommit=True,
    )


def test_a_slow_server_drops_the_rate_and_it_climbs_again(
    make_store: Callable[..., DataStore], local_cluster: LocalCluster
) -> None:
    store = make_store()
    store.declare_index(BY_LINK)
    cleaner = Cleaner(store, throttle=QUIET, name=backfill_name("by_link"))
    with copying(cleaner) as throttler:
        assert throttler.aimd.rate is None  # nothing over its limit yet
        locker = connect(local_cluster, 1)
        try:  # another session holds the canary row of server 1: its writes wait
            locker.query("START TRANSACTION")
            table = f"`{canary_db(store.cluster.topology.prefix)}`.`canary`"
            locker.query(f"SELECT * FROM {table} FOR UPDATE")
            locker.store_result()
            wait_until(lambda: throttler.aimd.rate is not None, timeout=30)
            assert throttler.aimd.reason.startswith("throttled: server 1 p90 ")
            assert throttler.aimd.rate < throttler.aimd.peak
            cleaner.heartbeat()
            env = cluster_env(local_cluster, store)
            out = CliRunner().invoke(cli, ["index", "status", "by_link"], env=env).output
            line = next(x for x in out.splitlines() if x.startswith("backfill:by_link"))
            assert "rows/s, throttled: server 1 p90 " in line and "> 400.0 ms" in line
            assert cleaner.figures.as_dict()["throttle"].startswith("throttled: server 1")
            assert "throttled: server 1 p90" in throttler.describe()
            # the time the canary held the copy back is counted, and named at the end
            wait_until(lambda: cleaner.figures.as_dict()["throttled_canary_s"] >= 0.5)
            assert "throttled " in cleaner.summary() and "(canary " in cleaner.summary()
            assert cleaner.figures.as_dict()["throttled_clients_s"] == 0.0
        finally:
            locker.close()  # rolls back: the lock is gone
        wait_until(lambda: throttler.aimd.reason.startswith("recovering"), timeout=30)
        low = throttler.aimd.rate
        assert low is not None
        wait_until(lambda: (throttler.aimd.rate or float("inf")) > 1.2 * low, timeout=30)


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped (an orphan's parent may be a
    container's init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_canaries_probe_from_a_child_in_a_session_of_its_own(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store()
    store.declare_index(BY_LINK)
    cleaner = Cleaner(store, throttle=QUIET, name=backfill_name("by_link"))
    with copying(cleaner) as throttler:
        assert throttler.probes is not None
        pid = throttler.probes.pid
        assert pid is not None and pid != os.getpid()
        # not the Cleaner's session, so not its autogroup (whose nice --nice lowers)
        assert os.getsid(pid) == pid != os.getsid(0)
        probes = [throttler.canaries[sid] for sid in sorted(throttler.canaries)]
        first = [canary.probes for canary in probes]
        wait_until(
            lambda: all(c.probes >= n + 3 for c, n in zip(probes, first, strict=True)), timeout=30
        )
        now = time.monotonic()
        assert all(c.latency_ms(now, 5.0, 0.9) is not None for c in probes)
    assert throttler.probes is None and _gone(pid)  # closed with the throttle


def test_the_probe_child_ends_when_the_cleaner_is_killed(
    make_store: Callable[..., DataStore], local_cluster: LocalCluster
) -> None:
    store = make_store()
    script = (
        "import sys, time\n"
        "from schemaless import DataStore\n"
        "from schemaless.cleaner.throttler import Throttler, ThrottleSettings\n"
        "store = DataStore(sys.argv[1].split(','), prefix=sys.argv[2], option_file=sys.argv[3])\n"
        "t = Throttler(store, ThrottleSettings(max_latency_ms=400.0))\n"
        "t.start('killed')\n"
        "print(t.probes.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    addresses = ",".join(str(a) for a in local_cluster.addresses)
    prefix = store.cluster.topology.prefix
    option_file = str(local_cluster.option_file)
    cmd = [sys.executable, "-c", script, addresses, prefix, option_file]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert not _gone(child)
        proc.kill()  # no chance to close anything
        proc.wait()
        wait_until(lambda: _gone(child), timeout=10)  # its next write found no reader
    finally:
        proc.kill()
        proc.wait()


def test_critical_load_pauses_and_resumes(
    make_store: Callable[..., DataStore], local_cluster: LocalCluster
) -> None:
    store = make_store()
    idle = connect(local_cluster, 0)
    try:
        idle.query("SHOW GLOBAL STATUS LIKE 'Threads_running'")
        running = int(idle.store_result().fetch_row()[0][1])
    finally:
        idle.close()
    limit = running + 4  # the sleepers below (and at most 2 more of our own) reach it
    settings = ThrottleSettings(
        max_latency_ms=400.0, max_load={}, critical_load={"Threads_running": limit}
    )
    cleaner = Cleaner(store, throttle=settings)
    with copying(cleaner) as throttler:
        sleepers = [connect(local_cluster, 0) for _ in range(limit + 2)]
        threads = [threading.Thread(target=s.query, args=("SELECT SLEEP(3)",)) for s in sleepers]
        try:
            for thread in threads:
                thread.start()
            wait_until(lambda: throttler.aimd.paused, timeout=3)
            assert throttler.aimd.reason.startswith("paused: server 0 Threads_running ")
            assert throttler.aimd.reason.endswith(f" >= {limit}")
            assert throttler.reserve(1) is None  # the copy waits
            assert cleaner.figures.as_dict()["throttle_limit"] == 0.0
        finally:
            for thread in threads:
                thread.join()
            for sleeper in sleepers:
                sleeper.close()
        wait_until(lambda: not throttler.aimd.paused, timeout=10)
        done = throttler._rows
        wait_until(lambda: throttler._rows > done, timeout=30)  # the copy goes on


def test_clients_report_their_write_latency(
    make_store: Callable[..., DataStore], local_cluster: LocalCluster
) -> None:
    store = make_store()
    store.cluster.latency._last = 0.0  # due at once
    for i in range(40):
        store.put({"link": f"http://example.com/{i}"})
    store.cluster.latency.maybe_publish(store.cluster.all_servers(store.cluster.topology).values())
    reports = store.cluster.catalog.client_reports(0)
    mine = reports[store.cluster.latency.name].latencies
    assert set(mine) == {str(a) for a in local_cluster.addresses}
    assert all(r["n"] >= 10 and r["p99_ms"] > 0 for r in mine.values())
    # a client's report over the limit throttles the Cleaner, which names the server
    server1 = str(store.cluster.topology.servers[1])
    store.cluster.catalog.report_client("slow-app", {server1: {"p99_ms": 900.0, "n": 50}})
    cleaner = Cleaner(store, throttle=QUIET)
    with copying(cleaner) as throttler:
        wait_until(lambda: throttler.aimd.rate is not None, timeout=30)
        assert throttler.aimd.reason == "throttled: server 1 clients' p99 900.0 ms > 400.0 ms"


def test_the_throttle_lets_a_round_of_bursts_go_without_waiting(
    make_store: Callable[..., DataStore],
) -> None:
    # a round pays a burst per server at once: the throttle's bucket holds a batch,
    # so a full bucket pays it at once (one that held a burst made every round sleep)
    store = make_store()
    cleaner = Cleaner(store, batch=2000, burst=250, rate=1000.0, throttle=QUIET)
    throttler = cleaner.throttler
    assert throttler is not None
    try:
        servers = len(store.cluster.topology.servers)
        assert throttler.reserve(250 * servers) == 0.0
        assert throttler.reserve(2000) > 0.0  # past the batch: the rate holds
    finally:
        cleaner.close()


def test_a_throttled_backfill_builds_the_entity_key_one_table_at_a_time(
    make_store: Callable[..., DataStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built at once on every server, the ``by_entity`` keys are a burst that no
    throttle paces: a throttled backfill builds them one table at a time and rests as
    long as each took."""
    store = make_store()
    load(store, 300)
    store.declare_index(BY_LINK)
    cleaner = Cleaner(store, batch=100, throttle=QUIET)
    rested: list[tuple[int, float, float]] = []  # (tables with the key, took, rested)
    rest = cleaner.rt.rest
    topo = store.cluster.current()
    # a table per logical shard, or per server in the owned layout
    tables = [(topo.shard_servers[s], topo.dbs[s]) for s in range(topo.n_shards)]

    def recorded(took: float) -> None:
        started = time.monotonic()
        rest(took)
        keyed = {tables[s] for s, has in entity_keys(store, BY_LINK).items() if has}
        rested.append((len(keyed), took, time.monotonic() - started))

    monkeypatch.setattr(cleaner.rt, "rest", recorded)
    try:
        assert cleaner.backfill("by_link") == "ready"
    finally:
        cleaner.close()
    assert [keyed for keyed, _, _ in rested] == list(range(1, len(set(tables)) + 1))
    assert all(slept >= took for _, took, slept in rested)
    assert all(entity_keys(store, BY_LINK).values())
    assert_clean(store, "by_link")


def test_the_command_backfills_with_the_throttle_on_by_default(
    make_store: Callable[..., DataStore], local_cluster: LocalCluster
) -> None:
    store, env = building(make_store, local_cluster, 300)
    result = invoke(env, "--index=by_link", "--max-load", "Threads_running=40")
    assert result.exit_code == 0, result.output
    assert store.cluster.refresh().indexes["by_link"].state == "ready"
    _, figures = store.cluster.catalog.statuses()["backfill:by_link"]
    assert "throttle_limit" in figures and "throttle" in figures
    prefix = store.cluster.topology.prefix
    canary = store.cluster.server(store.cluster.topology.servers[0])
    rows = canary.run(f"SELECT `name` FROM `{canary_db(prefix)}`.`canary`")[0]
    assert rows == (("backfill:by_link",),)


def test_bad_throttle_options_are_refused_before_anything_runs() -> None:
    for args, message in (
        (["--max-load", "x"], "Invalid value for '--max-load': expected STATUS_VARIABLE=N"),
        (["--critical-load", "Threads_running=0"], "Invalid value for '--critical-load'"),
        (["--max-load", "a`b=1"], "got 'a`b=1'"),
        (["--max-latency-ms", "0"], "Invalid value for '--max-latency-ms'"),
        (["--max-lag", "-1"], "Invalid value for '--max-lag'"),
    ):
        result = CliRunner().invoke(main, args, env={"SCHEMALESS_URL": "mysql://nowhere:1"})
        assert result.exit_code == 1 and message in result.output, result.output
