"""A sick server costs one timeout, once: a frozen server behind a pool of stale idle
connections fails the first call within its deadline, marks the server down, and every
later call for it fails at once, while the other server serves as before; after SIGCONT
the client's probe finds it answering and it is used again within a second."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from schemaless import DataStore, Index, ShardUnavailable, TransientError
from schemaless.cleaner.verify import diff_indexes
from schemaless.connection import Server
from schemaless.local import LocalCluster

from .helpers import ids_on, thawed, timed, values_on

#: The timeouts (and the call deadline) of this module's datastores, in seconds.
TIMEOUT = 2.0
#: What a call may take beyond its deadline on a loaded 2-core machine.
MARGIN = 1.0
#: A call for a server marked down fails at once: 50 ms is the goal, this the bound a
#: loaded machine must keep (a call that waits for the server takes TIMEOUT).
FAST = 0.2

BY_N = Index("by_n", {"n": "int"})


def _store(fault_store: Callable[..., DataStore], indexes: list[Index], **kwargs: Any) -> DataStore:
    timeouts = ("connect_timeout", "read_timeout", "write_timeout", "timeout")
    return fault_store(indexes, **dict.fromkeys(timeouts, TIMEOUT), **kwargs)


def _server(store: DataStore, sid: int) -> Server:
    return store.cluster.all_servers(store.cluster.topology)[sid]


def _stale_pool(server: Server, n: int) -> None:
    """``n`` idle connections to ``server``, each idle for longer than ``stale_after``
    (aged by hand: waiting 30 s would make the test slow)."""
    with contextlib.ExitStack() as stack:
        for _ in range(n):
            stack.enter_context(server.connection())
    idle = list(server._idle)
    assert len(idle) == n
    for conn in idle:
        conn.last_used -= server.options.stale_after + 1


def _fails_fast(what: str, fn: Callable[[], object]) -> float:
    elapsed, result = timed(fn)
    assert isinstance(result, ShardUnavailable), f"{what}: {result!r}"
    assert "marked down since" in str(result), f"{what}: {result}"
    assert elapsed < FAST, f"{what} took {elapsed:.3f}s"
    return elapsed


def _used_again_after_thaw(cluster: LocalCluster, store: DataStore, fn: Callable[[], Any]) -> Any:
    """Resume server 1; ``fn()`` once it works, which must be within a second."""
    cluster.resume_server(1)
    started = time.monotonic()
    while True:
        try:
            result = fn()
            break
        except TransientError:  # a put's may be OutcomeUnknown
            assert time.monotonic() - started < 1.0 + MARGIN / 2, "server 1 not used again"
            time.sleep(0.01)
    assert store.health()[_server(store, 1).name].state != "down"
    return result


def test_a_stale_pool_on_a_frozen_server_costs_one_timeout_once(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    store = _store(fault_store, [])
    zero, one = ids_on(store, 0, 1)[0], ids_on(store, 1, 1)[0]
    store.put_many([{"id": zero, "n": 0}, {"id": one, "n": 1}])
    sick = _server(store, 1)
    _stale_pool(sick, 8)

    fault_cluster.pause_server(1)
    try:
        elapsed, first = timed(lambda: store.get(one))
        assert isinstance(first, ShardUnavailable), repr(first)
        assert elapsed < TIMEOUT + MARGIN, f"the first call took {elapsed:.2f}s"
        state = store.health()[sick.name]
        assert state.state == "down" and state.since is not None and state.downs == 1
        times = [_fails_fast(f"get {i}", lambda: store.get(one)) for i in range(20)]
        times += [_fails_fast("put", lambda: store.put({"id": one, "n": 2}))]
        assert statistics.median(times) < 0.05, times
        elapsed, got = timed(lambda: store.get(zero))  # the other server: unaffected
        assert got == {"id": zero, "n": 0} and elapsed < MARGIN
    finally:
        got = _used_again_after_thaw(fault_cluster, store, lambda: store.get(one))
    assert got == {"id": one, "n": 1}  # the failed put was refused before it was sent
    assert store.health()[sick.name].state == "healthy"


def test_a_put_across_servers_while_one_is_frozen(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    """Puts whose entity and index rows live on different servers: the first fails
    within its deadline, the later ones at once; after the thaw every entity is exact
    or absent and the index is a superset of what the entities produce."""
    store = _store(fault_store, [BY_N])
    n0 = values_on(store, BY_N, 0, 9, start=100)
    n1 = values_on(store, BY_N, 1, 8, start=100)
    e0, e1 = ids_on(store, 0, 9), ids_on(store, 1, 8)
    local = {"id": e0.pop(), "n": n0.pop()}  # entity and row on server 0
    _stale_pool(_server(store, 1), 8)
    entity_on_1 = [{"id": k, "n": n} for k, n in zip(e1, n0, strict=True)]  # rows on 0
    rows_on_1 = [{"id": k, "n": n} for k, n in zip(e0, n1, strict=True)]  # entity on 0
    outcomes: dict[bytes, object] = {}

    fault_cluster.pause_server(1)
    try:
        elapsed, outcomes[e1[0]] = timed(lambda: store.put(entity_on_1[0]))
        assert isinstance(outcomes[e1[0]], TransientError), repr(outcomes[e1[0]])
        assert elapsed < TIMEOUT + MARGIN, f"the first put took {elapsed:.2f}s"
        for entity in entity_on_1[1:] + rows_on_1:
            _fails_fast("put", lambda e=entity: store.put(e))
        elapsed, version = timed(lambda: store.put(local))  # all on server 0: works
        assert isinstance(version, int) and elapsed < MARGIN
    finally:
        _used_again_after_thaw(fault_cluster, store, lambda: store.get(e1[0]))

    for entity in entity_on_1 + rows_on_1:
        got = store.get(entity["id"])
        assert got is None or got == entity, f"{entity} became {got}"  # exact or absent
        if entity is not entity_on_1[0]:
            assert got is None, f"{entity} was refused at once, yet stored"
    assert store.get(local["id"]) == local
    for diff in diff_indexes(store).values():  # the superset holds
        assert not diff.missing and not diff.behind


def test_many_threads_while_one_server_freezes(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    """16 threads per server get and put; server 1 freezes for 4 s.  No call waits longer
    than the deadline, and the healthy server's throughput stays within 2x of before."""
    store = _store(fault_store, [], pool_size=16)
    keys = {sid: ids_on(store, sid, 16) for sid in (0, 1)}
    store.put_many([{"id": k, "n": 0} for ks in keys.values() for k in ks])
    done: dict[int, list[tuple[float, float, bool]]] = {0: [], 1: []}  # (ended, seconds, ok)
    unexpected: list[BaseException] = []
    stop = threading.Event()

    def client(sid: int, key: bytes) -> None:
        n = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                if n % 4:
                    store.get(key)
                else:
                    store.put({"id": key, "n": n})
                ok = True
            except TransientError:  # OutcomeUnknown included: a blind put, retried next
                ok = False
            except BaseException as exc:
                unexpected.append(exc)
                return
            ended = time.monotonic()
            done[sid].append((ended, ended - started, ok))
            n += 1
            if not ok:
                time.sleep(0.01)  # a client backs off a little on a retryable error

    threads = [
        threading.Thread(target=client, args=(sid, key), daemon=True)
        for sid, ks in keys.items()
        for key in ks
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)  # warm up
        before = time.monotonic()
        time.sleep(2.0)
        frozen = time.monotonic()
        fault_cluster.pause_server(1)
        time.sleep(4.0)
        thaw = time.monotonic()
    finally:
        fault_cluster.resume_server(1)
    thawed(store)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(TIMEOUT + MARGIN)
    assert not unexpected, unexpected[:3]
    slowest = max(seconds for ops in done.values() for _, seconds, _ in ops)
    assert slowest < TIMEOUT + MARGIN, f"a call took {slowest:.2f}s"

    def rate(sid: int, start: float, end: float) -> float:
        return sum(ok and start <= ended < end for ended, _, ok in done[sid]) / (end - start)

    healthy_before, healthy_frozen = rate(0, before, frozen), rate(0, frozen, thaw)
    assert healthy_frozen > healthy_before / 2, (healthy_before, healthy_frozen)
    assert any(ok and ended > thaw for ended, _, ok in done[1]), "server 1 not used again"
