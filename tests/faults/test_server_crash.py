"""A server SIGKILLed during writes, and right after a commit was sent, then restarted:
callers get typed errors (OutcomeUnknown where the commit may have happened), every
entity is old or new afterwards, and a retry with the same expect_version is safe."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import same_store

from schemaless import (
    ConflictError,
    DataStore,
    Index,
    OutcomeUnknown,
    ShardUnavailable,
    TransientError,
    new_id,
)
from schemaless.cleaner.daemon import Cleaner
from schemaless.cleaner.verify import diff_indexes
from schemaless.hashing import shard_of
from schemaless.local import LocalCluster

from .helpers import ids_on, moved_away, thawed, values_on, wait_for

BY_N = Index("by_n", {"n": "int"})


def settle(store: DataStore, entity: dict[str, Any], expect: int) -> str:
    """Retry a write whose outcome is unknown with the same expect_version; which of the
    two possible outcomes it was."""
    try:
        version = store.put(entity, expect_version=expect)
    except ConflictError as exc:
        # The first attempt applied: it, not some other write, made the version move.
        assert exc.current_version == expect + 1
        assert store.get(entity["id"]) == entity
        return "had applied"
    assert version == expect + 1
    assert store.get(entity["id"]) == entity
    return "applies now"


@pytest.mark.parametrize("wake", ["resume", "kill"])
def test_commit_sent_then_server_killed(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster, wake: str
) -> None:
    """The batch with the COMMIT reaches a frozen server; the client times out
    (OutcomeUnknown).  ``resume``: the server wakes, commits, then is SIGKILLed (the
    commit is durable).  ``kill``: it is SIGKILLed before running the batch."""
    store = fault_store([BY_N])
    (key,) = ids_on(store, 1, 1)
    n_old, n_new = values_on(store, BY_N, 0, 2)  # index rows on the other server
    old = {"id": key, "n": n_old}
    v1 = store.put(old, expect_version=0)
    new = {"id": key, "n": n_new}
    fault_cluster.pause_server(1)
    try:
        with pytest.raises(OutcomeUnknown) as info:
            store.put(new, expect_version=v1)
        assert "outcome unknown" in str(info.value) and info.value.retryable
        if wake == "resume":
            fault_cluster.resume_server(1)
            thawed(store)  # the timeout marked the server down until a probe answers
            wait_for(lambda: store.get(key) == new, what="the sent commit to apply")
    finally:
        fault_cluster.kill_server(1)
        fault_cluster.start_server(1)
    thawed(store)
    got = store.get(key)
    assert got == (new if wake == "resume" else old)
    assert settle(store, new, v1) == ("had applied" if wake == "resume" else "applies now")
    assert [e.id for e in store.query(BY_N, n=n_new)] == [key]
    assert not store.query(BY_N, n=n_old)  # the re-filter hides the stale row, if any
    for diff in diff_indexes(store).values():
        assert not diff.missing and not diff.behind


def test_server_killed_during_concurrent_writes(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    store = fault_store([BY_N], pool_size=8)
    keys = ids_on(store, 0, 12) + ids_on(store, 1, 12)
    random.Random(7).shuffle(keys)
    acked: dict[bytes, tuple[dict[str, Any], int]] = {}
    for key in keys:
        entity = {"id": key, "n": 0, "who": "init"}
        acked[key] = (entity, store.put(entity, expect_version=0))
    in_flight: dict[bytes, tuple[dict[str, Any], int, Exception]] = {}
    unexpected: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(mine: list[bytes]) -> None:
        rng = random.Random(mine[0])
        while not stop.is_set():
            key = rng.choice(mine)
            version = acked[key][1]
            new = {"id": key, "n": rng.randrange(50), "who": threading.current_thread().name}
            try:
                stored = store.put(new, expect_version=version)
            except TransientError as exc:  # OutcomeUnknown, ShardUnavailable, ShardTimeout
                with lock:
                    in_flight[key] = (new, version, exc)
                return
            except BaseException as exc:
                unexpected.append(exc)
                return
            with lock:
                acked[key] = (new, stored)

    threads = [threading.Thread(target=writer, args=(keys[i::4],), name=f"w{i}") for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    fault_cluster.kill_server(1)
    time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a writer hangs"
    assert not unexpected, f"untyped errors: {unexpected!r}"
    assert in_flight, "no write was interrupted"
    fault_cluster.start_server(1)

    # Every entity is the last acknowledged version or the one in flight, never torn.
    for key, got in zip(keys, store.get_many(keys), strict=True):
        body, version = acked[key]
        # the write in flight may carry the same body as the last one (n is one of 50):
        # its version tells them apart
        if key in in_flight and (got != body or got is None or got.version != version):
            new, _, error = in_flight[key]
            assert got == new, f"neither old nor new: {got!r}"
            assert isinstance(error, OutcomeUnknown), f"{error!r}, yet the write applied"
        else:
            assert got == body and got is not None and got.version == version
    branches = {settle(store, new, expect) for new, expect, _ in in_flight.values()}
    assert branches <= {"had applied", "applies now"}
    for diff in diff_indexes(store).values():
        assert not diff.missing and not diff.behind
    Cleaner(store, fence_after=0).run_once()
    assert all(d.clean for d in diff_indexes(store).values())


def test_no_spurious_outcome_unknown_after_a_restart(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    """Pooled connections to a server that restarted are dead: a write must not be sent
    on one (it would be reported OutcomeUnknown although it never reached a server)."""
    store = fault_store()
    keys = ids_on(store, 1, 6)
    barrier = threading.Barrier(len(keys))

    def first_write(key: bytes) -> None:
        barrier.wait()
        store.put({"id": key, "n": 0})

    threads = [threading.Thread(target=first_write, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fault_cluster.kill_server(1)
    fault_cluster.start_server(1)
    for key in keys:  # one after another: each may take a pooled connection
        store.put({"id": key, "n": 1}, expect_version=store.get(key).version)  # type: ignore[union-attr]
    assert [e["n"] for e in store.get_many(keys) if e is not None] == [1] * len(keys)


@pytest.mark.parametrize("op", ["put", "delete"])
def test_a_committed_write_is_acknowledged_when_only_stale_rows_fail(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster, op: str
) -> None:
    """The entity and its new index rows are on server 0, its old index row on server 1,
    which is down: steps 1 and 2 succeed, step 3 (deleting the old row, never needed for
    correctness) cannot run.  The write committed, so the caller is told so, not
    ShardUnavailable ("nothing was committed"); the stale row is left to the Cleaner.
    """
    store = fault_store([BY_N])
    (key,) = ids_on(store, 0, 1)
    (n_old,) = values_on(store, BY_N, 1, 1)
    (n_new,) = values_on(store, BY_N, 0, 1)
    v1 = store.put({"id": key, "n": n_old})
    fault_cluster.kill_server(1)
    try:
        if op == "put":
            assert store.put({"id": key, "n": n_new}, expect_version=v1) == v1 + 1
        else:
            assert store.delete(key, expect_version=v1) is True
    finally:
        fault_cluster.start_server(1)
    assert store.get(key) == ({"id": key, "n": n_new} if op == "put" else None)
    Cleaner(store, fence_after=0).run_once()  # removes the stale row step 3 left
    assert all(d.clean for d in diff_indexes(store).values())


@pytest.mark.parametrize("layout", ["owned", "databases"])
def test_a_committed_write_is_acknowledged_when_the_stale_rows_table_is_gone(
    make_store: Callable[..., DataStore], layout: str
) -> None:
    """Step 3 meets a missing table (as while its logical shard is moved away): the
    write committed, so it is acknowledged, not reported as TableMissing (nor run again
    by the reroute logic, which would turn a committed compare-and-set into a
    ConflictError).  Fix: ``_remove_stale`` leaves the rows to the Cleaner on any
    SchemalessError, not only ShardUnavailable."""
    store = make_store(indexes=[BY_N], layout=layout)
    topo = store.cluster.topology
    shard_of_n = {n: shard_of(BY_N.shard_key((n,)), topo.n_shards) for n in range(50)}
    n_old = 0
    gone = shard_of_n[n_old]
    n_new = next(n for n, s in shard_of_n.items() if s != gone)
    key = next(k for k in iter(new_id, None) if store.cluster.shard_of_id(k) != gone)
    v1 = store.put({"id": key, "n": n_old})
    with moved_away(store, gone, BY_N.table):
        assert store.put({"id": key, "n": n_new}, expect_version=v1) == v1 + 1
    assert store.get(key) == {"id": key, "n": n_new}


def test_with_the_catalog_server_down_the_other_servers_stay_in_use(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    """Server 0 holds the catalog. While it is down, clients carry on with the map they
    have: reads, writes and queries of what lives on server 1 work past the refresh
    interval (every operation used to fail once the map was due for a reload), what
    lives on server 0 fails with ShardUnavailable, and the map is reloaded once the
    catalog answers again."""
    store = fault_store([BY_N], refresh_interval=0.2)
    keys = ids_on(store, 1, 3)
    ns = values_on(store, BY_N, 1, 3)
    for key, n in zip(keys, ns, strict=True):
        store.put({"id": key, "n": n})
    fault_cluster.kill_server(0)
    try:
        time.sleep(0.5)  # the map is due for a reload
        for _ in range(3):  # and again after a failed reload
            store.put({"id": keys[0], "n": ns[1]})
            assert store.get(keys[1]) == {"id": keys[1], "n": ns[1]}
            assert sorted(e["id"] for e in store.query(BY_N, n=ns[1])) == sorted(keys[:2])
            time.sleep(0.25)
        with pytest.raises(ShardUnavailable):
            store.get(ids_on(store, 0, 1)[0])
    finally:
        fault_cluster.start_server(0)
    admin = same_store(fault_cluster, store)
    admin.drop_index("by_n")  # seen by the first client at its next reload
    admin.close()
    wait_for(lambda: store.cluster.current().indexes["by_n"].state == "dropped", timeout=10)
