"""The Cleaner on a partial cluster: with one server of three stopped (or frozen), a
pass and a backfill finish the work of the healthy servers within seconds and report
the stopped server's logical shards as pending; once it is back, the same Cleaner
(a daemon needs no restart) finishes them, and the oracle is exact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import assert_clean, drop_datastore, shard_rows
from test_cleaner_cli import cluster_env

from schemaless import DataStore, Index, failpoints
from schemaless.catalog import IndexState, backfill_job
from schemaless.cleaner.access import upsert_rows
from schemaless.cleaner.daemon import Cleaner
from schemaless.cleaner.main import PENDING_EXIT, _verify, main
from schemaless.cleaner.throttler import ThrottleSettings
from schemaless.cleaner.verify import diff_indexes
from schemaless.cli.main import cli
from schemaless.deferrals import Deferrals
from schemaless.errors import OutcomeUnknown, SchemalessError
from schemaless.hashing import shard_of
from schemaless.ids import id_hex
from schemaless.local import LocalCluster
from schemaless.writes import IndexRow

from .conftest import revive
from .helpers import ids_on, scratch_cluster, values_on, wait_for

#: The stopped (or frozen) server: not the catalog's (server 0).
SICK = 2
TIMEOUT = 1.0
#: What a pass with one server down may take: a few patiences and timeouts, on a
#: loaded 2-core machine (a pass that waits for the server never ends).
BOUND = 20.0
#: a liveness bound where a writer thread and a crashed run share the two cores with the
#: backfill (CI runs another test beside it): a hang still fails, a slow machine does not
BUSY_BOUND = 60.0

BY_N = Index("by_n", {"n": "int"})
BY_M = Index("by_m", {"m": "int"})


@pytest.fixture(scope="module")
def trio() -> Iterator[LocalCluster]:
    """Three servers of their own (the fault suite's cluster has two)."""
    with scratch_cluster("partial", servers=3) as cluster:
        yield cluster


@pytest.fixture
def store(trio: LocalCluster) -> Iterator[DataStore]:
    """A datastore on the three servers, short timeouts; every server running again
    afterwards, and the datastore dropped."""
    revive(trio)
    ds = DataStore(
        trio.addresses,
        [BY_N],
        prefix="p_" + uuid.uuid4().hex[:12],
        shards=8,
        refresh_interval=0.2,
        option_file=str(trio.option_file),
        connect_timeout=TIMEOUT,
        read_timeout=TIMEOUT,
        write_timeout=TIMEOUT,
        expire_on="expires",
    )
    yield ds
    revive(trio)
    wait_for(lambda: _answers(ds), 10.0, "every server to answer")
    drop_datastore(ds)


def _answers(store: DataStore) -> bool:
    try:
        for server in store.cluster.all_servers(store.cluster.topology).values():
            server.run("SELECT 1")
    except Exception:
        return False
    return True


def _cleaner(store: DataStore, **kwargs: Any) -> Cleaner:
    settings = {"patience": 1.0, "tombstone_retention": 0, "fence_after": 0, "backoff_cap": 0.5}
    return Cleaner(store, **{**settings, **kwargs})


def _sick_shards(store: DataStore) -> set[int]:
    return set(store.cluster.topology.shards_of(SICK))


def _load(store: DataStore, index: Index, orphans: bool = True) -> dict[int, list[bytes]]:
    """Entities on each server whose rows in ``index`` live on the same server (the
    healthy servers' work never needs the sick one); per server: ids (3 live, 1 deleted:
    a tombstone), one expired entity and, with ``orphans``, one orphan row of an absent
    id."""
    prop = index.properties[0]
    out: dict[int, list[bytes]] = {}
    topo = store.cluster.topology
    for sid in (0, 1, SICK):
        ids = ids_on(store, sid, 6)
        values = values_on(store, index, sid, 6, start=1000 * sid)
        for key, value in zip(ids, values, strict=True):
            store.put({"id": key, prop: value, "server": sid})
        store.delete(ids[3])
        store.put({"id": ids[5], prop: values[5], "expires": 1.0})  # long expired
        out[sid] = ids[:4]
        if not orphans:
            continue
        orphan = (values[4],)
        target = shard_of(index.shard_key(orphan), topo.n_shards)
        upsert_rows(store, topo, [IndexRow(index, target, orphan, ids[4], 1)])
    return out


def _tombstones(store: DataStore, shards: set[int]) -> int:
    """Tombstones stored on these logical shards."""
    return sum(
        int(shard_rows(store, shard, "entities", "COUNT(*)", "body IS NULL")[0][0])
        for shard in shards
    )


def _unverified(store: DataStore) -> list[int]:
    """The oracle on the reachable shards (clean there); the shards not read."""
    diff = diff_indexes(store, partial=True)[BY_N.name]
    assert diff.clean, diff.summary()
    return diff.unverified


@pytest.mark.parametrize("fault", ["stop", "freeze"])
def test_a_pass_finishes_the_healthy_shards_then_the_rest(
    store: DataStore, trio: LocalCluster, fault: str
) -> None:
    _load(store, BY_N)
    sick = _sick_shards(store)
    healthy = set(range(8)) - sick
    cleaner = _cleaner(store, throttle=ThrottleSettings(baseline_seconds=0.5))
    try:
        if fault == "stop":
            trio.stop_server(SICK)
        else:
            trio.pause_server(SICK)
        started = time.monotonic()
        figures = cleaner.run_once(now=time.time() + 60)  # its own tombstones count as old
        took = time.monotonic() - started
        assert took < BOUND, f"a pass with a server down took {took:.1f}s"
        assert set(cleaner.rt.pending) == sick
        assert figures["pending_shards"] == len(sick) and figures["state"] == "pending"
        assert figures["expired_purged"] == 2  # the healthy servers' expired entities
        assert "logical shard(s)" in cleaner.pending_text()
        # the healthy servers' work is done: their orphans deleted, tombstones purged
        assert _unverified(store) == sorted(sick)
        assert _verify(store, (), False, 3, 0.0) == (False, sick)  # `cleaner verify`: exit 3
        assert _tombstones(store, healthy) == 0
    finally:
        revive(trio)
    wait_for(lambda: _answers(store), 10.0, "the sick server to answer")
    assert _tombstones(store, sick) >= 1  # nothing was done there
    status = CliRunner().invoke(cli, ["index", "status", "by_n"], env=cluster_env(trio, store))
    assert f"{len(sick)} logical shard(s) pending" in status.output, status.output
    figures = cleaner.run_once(now=time.time() + 60)  # the same Cleaner: no restart
    cleaner.close()
    assert cleaner.rt.pending == {} and figures["pending_shards"] == 0
    assert figures["state"] == "idle" and figures["expired_purged"] == 3
    assert _tombstones(store, set(range(8))) == 0
    assert_clean(store)


def test_a_running_daemon_finishes_the_pending_shards_without_a_restart(
    store: DataStore, trio: LocalCluster
) -> None:
    _load(store, BY_N)
    sick = _sick_shards(store)
    cleaner = _cleaner(store, interval=0.2)
    trio.stop_server(SICK)
    daemon = threading.Thread(target=cleaner.run_forever)
    daemon.start()
    try:
        try:
            wait_for(
                lambda: (
                    cleaner.figures.as_dict()["pending_shards"] == len(sick)
                    and cleaner.figures.as_dict()["passes"] >= 1
                ),
                BOUND,
                "a pass that leaves the sick server's shards pending",
            )
        finally:
            revive(trio)
        wait_for(
            lambda: (
                cleaner.figures.as_dict()["state"] == "idle"
                and cleaner.figures.as_dict()["pending_shards"] == 0
            ),
            BOUND,
            "a complete pass of the same daemon",
        )
    finally:
        cleaner.shutdown.request()
        daemon.join(BOUND)
        cleaner.close()
    assert cleaner.figures.as_dict()["expired_purged"] == 3
    assert_clean(store)


@pytest.mark.parametrize("fault", ["stop", "freeze"])
def test_a_backfill_finishes_the_healthy_shards_and_waits_for_the_rest(
    store: DataStore, trio: LocalCluster, fault: str
) -> None:
    ids = _load(store, BY_M, orphans=False)
    store.declare_index(BY_M)
    sick = _sick_shards(store)
    cleaner = _cleaner(store)
    catalog = store.cluster.catalog
    result: list[IndexState | BaseException] = []

    def backfill() -> None:
        try:
            result.append(cleaner.backfill("by_m"))
        except BaseException as exc:
            result.append(exc)

    if fault == "stop":
        trio.stop_server(SICK)
    else:
        trio.pause_server(SICK)
    thread = threading.Thread(target=backfill)
    thread.start()
    try:

        def healthy_done() -> bool:
            saved = catalog.checkpoints(backfill_job("by_m"))
            done = {s for s, (_, finished, _) in saved.items() if finished}
            return done == set(range(8)) - sick and set(cleaner.rt.pending) == sick

        wait_for(healthy_done, BOUND, "the healthy shards to be backfilled")
        assert cleaner.figures.as_dict()["pending_shards"] == len(sick)
        assert store.cluster.refresh().indexes["by_m"].state == IndexState.BUILDING
        assert not result, result  # it waits for the sick server's shards
    finally:
        revive(trio)
    thread.join(BOUND + 30)
    assert result == [IndexState.READY]
    cleaner.close()
    assert_clean(store)
    for keys in ids.values():
        for key in keys[:3]:
            (got,) = store.query("by_m", m=store.get(key)["m"])
            assert got["id"] == key


def test_work_that_needs_the_sick_server_is_left_pending(
    store: DataStore, trio: LocalCluster
) -> None:
    """Rows across servers: an entity on a healthy server with its row on the sick one
    (the recent pass cannot read that row there, so it cannot tell whether it must be
    written: its shard's mark stays), an entity on the sick server with its row on a
    healthy one (the sweep cannot check it), and an orphan there of an id the sick
    server would store (the sweep cannot fence it: the row stays)."""
    topo = store.cluster.topology
    n = topo.n_shards
    (near,) = ids_on(store, 0, 1)
    far, absent = ids_on(store, SICK, 2)
    on_sick, on_healthy, orphan_value = (
        values_on(store, BY_N, SICK, 1)[0],
        *values_on(store, BY_N, 1, 2),
    )
    store.put({"id": far, "n": on_healthy})
    store.put({"id": near, "n": on_sick})
    target = shard_of(BY_N.shard_key((orphan_value,)), n)
    upsert_rows(store, topo, [IndexRow(BY_N, target, (orphan_value,), absent, 1)])
    cleaner = _cleaner(store, tombstone_retention=3600)  # the recent pass looks back 1 h
    trio.stop_server(SICK)
    try:
        cleaner.run_once(now=time.time() + 60)
        sick = _sick_shards(store)
        near_shard = shard_of(near, n)
        far_row = shard_of(BY_N.shard_key((on_healthy,)), n)
        assert set(cleaner.rt.pending) == sick | {near_shard, far_row, target}
        assert near_shard not in store.cluster.catalog.checkpoints("recent")
        rows = shard_rows(store, target, BY_N.table, "COUNT(*)", "`entity_id` = %s", (absent,))
        assert int(rows[0][0]) == 1  # the orphan is still there: not fenced, not deleted
    finally:
        revive(trio)
    wait_for(lambda: _answers(store), 10.0, "the sick server to answer")
    cleaner.run_once(now=time.time() + 60)
    cleaner.close()
    assert cleaner.rt.pending == {}
    assert_clean(store)


def test_once_exits_pending_then_zero(store: DataStore, trio: LocalCluster) -> None:
    """``cleaner --once`` whose server stops during the pass: exit status 3 and the
    shards named; the next ``--once`` exits 0 with the indexes exact."""
    _load(store, BY_N)
    env = cluster_env(trio, store)
    stopped: list[bool] = []

    def stop_once() -> None:
        if not stopped:
            stopped.append(True)
            trio.stop_server(SICK)

    failpoints.set("cleaner.after_read", stop_once)
    try:
        args = ["--once", "--no-throttle", "--pending-after", "0.5", "--tombstone-retention", "0"]
        result = CliRunner().invoke(main, args, env=env)
    finally:
        failpoints.clear()
        revive(trio)
    assert result.exit_code == PENDING_EXIT, result.output
    assert "Pending: logical shard(s)" in result.output
    wait_for(lambda: _answers(store), 10.0, "the sick server to answer")
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 0, result.output
    assert_clean(store)


# -- a backfill while a server is down: deferred rows ------------------------------------


def _spread(store: DataStore, n: int) -> dict[bytes, int]:
    """``n`` entities with random ids and values ``m`` hashed over every logical shard
    (so nearly every batch has rows for every server); id -> m."""
    out = {}
    for m in range(n):
        entity = {"m": m}
        store.put(entity)
        out[entity["id"]] = m
    return out


def _rows_on(store: DataStore, index: Index, shards: set[int]) -> int:
    """Rows of a (building) index stored on these logical shards."""
    return sum(int(shard_rows(store, shard, index.table, "COUNT(*)")[0][0]) for shard in shards)


def _added_ids(store: DataStore, shards: set[int]) -> dict[bytes, int]:
    """id -> added_id of the entities stored on these logical shards."""
    out: dict[bytes, int] = {}
    for shard in shards:
        out.update(
            {bytes(k): int(a) for a, k in shard_rows(store, shard, "entities", "added_id, id")}
        )
    return out


class _Backfill(threading.Thread):
    """``cleaner.backfill(name)`` in a thread; ``result``: its state or exception."""

    def __init__(self, cleaner: Cleaner, name: str) -> None:
        super().__init__()
        self.cleaner, self.name_ = cleaner, name
        self.result: list[IndexState | BaseException] = []

    def run(self) -> None:
        try:
            self.result.append(self.cleaner.backfill(self.name_))
        except BaseException as exc:
            self.result.append(exc)


def _healthy_scanned(
    store: DataStore, sick: set[int], name: str, pairs: set[tuple[int, int]] | None = None
) -> Any:
    """A predicate: every healthy logical shard's checkpoint is done, and deferrals are
    recorded (exactly for the (source, target) ``pairs`` if given)."""
    catalog = store.cluster.catalog
    healthy = set(range(store.cluster.topology.n_shards)) - sick

    def check() -> bool:
        saved = catalog.checkpoints(backfill_job(name))
        done = {s for s, (_, finished, _) in saved.items() if finished}
        found = {(d.source, d.target) for d in Deferrals(catalog).of(name)}
        return done == healthy and bool(found) and found == (pairs or found)

    return check


@pytest.mark.parametrize("fault", ["stop", "freeze"])
def test_a_backfill_defers_the_rows_for_a_sick_server_and_writes_only_them_later(
    store: DataStore, trio: LocalCluster, fault: str
) -> None:
    """Values hashed over every shard: every batch of a healthy shard has rows for the
    stopped (or frozen) server.  The healthy shards are scanned to the end, their rows
    for healthy shards written and those for the sick server's deferred; the index cannot be
    made ready; once the server is back, the same backfill writes only the deferred
    rows (and the stopped server's own shards), and the oracle is exact."""
    ids = _spread(store, 400)
    store.declare_index(BY_M)
    topo = store.cluster.topology
    n = topo.n_shards
    sick = _sick_shards(store)
    healthy = set(range(n)) - sick
    source = {key: shard_of(key, n) for key in ids}
    target = {key: shard_of(BY_M.shard_key((m,)), n) for key, m in ids.items()}
    now_rows = sum(1 for k in ids if source[k] in healthy and target[k] in healthy)
    later_rows = len(ids) - now_rows
    cleaner = _cleaner(store, batch=20)  # several batches per shard: deferrals extended
    pairs = {(source[k], target[k]) for k in ids if source[k] in healthy and target[k] in sick}
    if fault == "stop":
        trio.stop_server(SICK)
    else:
        trio.pause_server(SICK)
    backfill = _Backfill(cleaner, "by_m")
    backfill.start()
    try:
        scanned = _healthy_scanned(store, sick, "by_m", pairs)
        wait_for(scanned, BOUND, "the healthy shards scanned")
        # a batch's figures are added just after its checkpoint: wait for the last one's
        checked = sum(1 for k in ids if source[k] in healthy)
        wait_for(
            lambda: cleaner.figures.as_dict()["rows_checked"] >= checked,
            BOUND,
            "the healthy shards' rows counted",
        )
        figures = cleaner.figures.as_dict()
        assert figures["rows_backfilled"] == now_rows, figures
        assert figures["rows_deferred"] == sum(
            1 for k in ids if source[k] in healthy and target[k] in sick
        )
        assert _rows_on(store, BY_M, healthy) == now_rows
        # every row not written is in its (source, target) deferral's range
        added = _added_ids(store, healthy)
        ranges = {(d.source, d.target): d for d in Deferrals(store.cluster.catalog).of("by_m")}
        for key in ids:
            if source[key] in healthy and target[key] in sick:
                d = ranges[source[key], target[key]]
                assert d.after < added[key] <= d.upto
        positions = store.cluster.catalog.checkpoints(backfill_job("by_m"))
        assert not store.cluster.catalog.set_ready("by_m")  # the compare-and-set refuses
        assert store.cluster.refresh().indexes["by_m"].state == IndexState.BUILDING
        status = CliRunner().invoke(cli, ["index", "status", "by_m"], env=cluster_env(trio, store))
        assert status.exit_code == 0, status.output
        server = topo.servers[SICK]
        assert f"deferred: rows for {len(sick)} logical shard(s) on {server}" in status.output
        assert f"{len(sick)} of {n} shards still to scan" in status.output
        assert not backfill.result, backfill.result
    finally:
        revive(trio)
    backfill.join(BOUND + 30)
    assert backfill.result == [IndexState.READY]
    cleaner.close()
    assert cleaner.figures.as_dict()["rows_backfilled"] == now_rows + later_rows
    assert Deferrals(store.cluster.catalog).of("by_m") == []
    after = store.cluster.catalog.checkpoints(backfill_job("by_m"))
    assert {s: after[s] for s in healthy} == {s: positions[s] for s in healthy}  # not rescanned
    assert_clean(store)
    for key in list(ids)[:20]:
        (got,) = store.query("by_m", m=ids[key])
        assert got["id"] == key


def test_a_crash_before_a_deferral_and_a_writer_throughout_end_exact(
    store: DataStore, trio: LocalCluster
) -> None:
    """The backfill is SIGKILLed after writing a batch's healthy rows, before the
    deferral and the checkpoint are recorded (failpoint ``cleaner.before_deferral``);
    the next run,
    with the server still stopped, then back, ends exact; a writer creating and
    updating entities all along keeps every write it was told succeeded."""
    ids = _spread(store, 300)
    store.declare_index(BY_M)
    sick = _sick_shards(store)
    acknowledged: dict[bytes, int] = {}
    unsure: set[bytes] = set()
    stop = threading.Event()

    def writer() -> None:
        keys = list(ids)
        i = 0
        while not stop.is_set():
            i += 1
            key = keys[i % len(keys)] if i % 2 else None
            entity: dict[str, Any] = {"m": 10_000 + i}
            if key is not None:
                entity["id"] = key
            try:
                store.put(entity)
            except OutcomeUnknown:
                unsure.add(entity.get("id", b""))
                continue
            except SchemalessError:
                continue
            acknowledged[entity["id"]] = entity["m"]
            time.sleep(0.005)

    writing = threading.Thread(target=writer)
    writing.start()
    try:
        trio.stop_server(SICK)
        env = {
            **os.environ,
            **cluster_env(trio, store),
            "SCHEMALESS_FAILPOINTS": "cleaner.before_deferral=kill",
        }
        args = ["--index=by_m", "--batch", "20", "--pending-after", "1", "--no-throttle"]
        crashed = subprocess.run(
            [sys.executable, "-m", "schemaless.cleaner.main", *args],
            env=env,
            capture_output=True,
            timeout=BOUND + 30,
        )
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-2000:]
        written = _rows_on(store, BY_M, set(range(8)) - sick)
        assert written > 0  # it died after writing a batch's rows, before its checkpoint
        cleaner = _cleaner(store, batch=20)
        backfill = _Backfill(cleaner, "by_m")
        backfill.start()
        try:
            wait_for(
                _healthy_scanned(store, sick, "by_m"), BUSY_BOUND, "the healthy shards scanned"
            )
        finally:
            revive(trio)
        backfill.join(BOUND + 30)
        assert backfill.result == [IndexState.READY]
        time.sleep(0.5)  # the writer goes on with every server
    finally:
        stop.set()
        writing.join()
        revive(trio)
    wait_for(lambda: _answers(store), 10.0, "the sick server to answer")
    cleaner.run_once(now=time.time() + 60)  # the failed writes' leftovers
    cleaner.close()
    assert_clean(store)
    checked = {k: m for k, m in acknowledged.items() if k not in unsure}
    assert len(checked) > 50
    for key, m in checked.items():
        assert store.get(key)["m"] == m
        assert [e["id"] for e in store.query("by_m", m=m)] == [key]


def test_a_unique_index_checks_its_deferred_claims_when_they_are_written(
    store: DataStore, trio: LocalCluster
) -> None:
    """Claims of a unique index for the stopped server's shards are deferred with the
    rest; the duplicate among them (two entities on healthy servers, one value whose
    row lives on the stopped one) is found when they are written: the index stays
    building with that duplicate recorded, and every other value is indexed."""
    by_u = Index("by_u", {"u": "int"}, unique=True)
    (dup,) = values_on(store, by_u, SICK, 1, start=5000)
    for u in range(200):
        store.put({"u": u})
    twins = ids_on(store, 0, 1) + ids_on(store, 1, 1)
    for key in twins:
        store.put({"id": key, "u": dup})
    store.declare_index(by_u, force=True)
    cleaner = _cleaner(store, batch=20)
    trio.stop_server(SICK)
    backfill = _Backfill(cleaner, "by_u")
    backfill.start()
    try:
        sick = _sick_shards(store)
        wait_for(_healthy_scanned(store, sick, "by_u"), BOUND, "the healthy shards scanned")
        assert store.cluster.catalog.duplicates("by_u") == {}  # not written: not known yet
    finally:
        revive(trio)
    backfill.join(BOUND + 30)
    cleaner.close()
    assert backfill.result == [IndexState.BUILDING]
    recorded = store.cluster.catalog.duplicates("by_u").values()
    (found,) = [item for _, shown in recorded for item in shown]
    assert sorted(found["ids"]) == sorted(id_hex(key) for key in twins)
    assert Deferrals(store.cluster.catalog).of("by_u") == []
    diff = diff_indexes(store, ["by_u"])["by_u"]
    assert not diff.extra and not diff.behind  # every value but the twin's second is there
    assert [key for _, _, key in diff.missing] in ([twins[0]], [twins[1]]), diff.summary()
