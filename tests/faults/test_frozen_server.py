"""A frozen server (SIGSTOP): every operation that touches it fails with
ShardUnavailable within the configured timeout, the other server keeps serving, partial
queries name the missing shards, and after SIGCONT everything works again (once the
client's probe finds the server answering)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from schemaless import (
    ConflictError,
    DataStore,
    Index,
    OutcomeUnknown,
    TableMissing,
    TransientError,
)
from schemaless.cleaner.verify import diff_indexes
from schemaless.local import LocalCluster

from .conftest import TIMEOUT
from .helpers import ids_on, moved_away, thawed, timed, values_on, wait_for

#: What an operation on a frozen server may take beyond the timeout (thread handoffs,
#: the other server's part of a fan-out, a loaded CI machine).
MARGIN = 1.0

BY_N = Index("by_n", {"n": "int"})


def _populate(store: DataStore) -> dict[str, list[dict[str, Any]]]:
    """Entities named by where their entity row and index row live: ``local0`` (both on
    server 0), ``local1`` (both on 1), ``row1`` (entity on 0, index row on 1)."""
    n0 = values_on(store, BY_N, 0, 6, start=100)
    n1 = values_on(store, BY_N, 1, 6, start=100)
    groups = {
        "local0": [{"id": k, "n": n} for k, n in zip(ids_on(store, 0, 3), n0[:3], strict=True)],
        "local1": [{"id": k, "n": n} for k, n in zip(ids_on(store, 1, 3), n1[:3], strict=True)],
        "row1": [{"id": k, "n": n} for k, n in zip(ids_on(store, 0, 3), n1[3:], strict=True)],
    }
    store.put_many([e for group in groups.values() for e in group])
    return groups


def _fails_in_time(what: str, fn: Callable[[], object]) -> TransientError:
    elapsed, result = timed(fn)
    assert isinstance(result, TransientError), f"{what}: {result!r}"
    assert elapsed < TIMEOUT + MARGIN, f"{what} took {elapsed:.2f}s"
    assert "127.0.0.1:" in str(result), f"{what}: the error names no server: {result}"
    return result


def _works(what: str, fn: Callable[[], Any], limit: float = MARGIN) -> Any:
    elapsed, result = timed(fn)
    assert not isinstance(result, BaseException), f"{what}: {result!r}"
    assert elapsed < limit, f"{what} took {elapsed:.2f}s"
    return result


def test_every_operation_on_a_frozen_server_fails_in_time(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    store = fault_store([BY_N])
    groups = _populate(store)
    one = groups["local1"]
    zero = groups["local0"]
    n1_free = values_on(store, BY_N, 1, 1, 500)[0]
    n0_free, n0_other = values_on(store, BY_N, 0, 2, 500)
    store.get(one[0]["id"])  # a pooled connection to server 1 exists (and new ones are made)

    fault_cluster.pause_server(1)
    try:
        # The other server keeps serving whatever does not touch the frozen one.
        assert _works("get on server 0", lambda: store.get(zero[0]["id"])) == zero[0]
        page = _works(  # waits for the frozen server's timeout
            "partial query", lambda: store.query(BY_N, n__gte=0, partial=True), TIMEOUT + MARGIN
        )
        assert page.missing_shards == tuple(store.cluster.topology.shards_of(1))
        assert {e["id"] for e in page} == {e["id"] for e in zero}
        _works("put on server 0", lambda: store.put({**zero[2], "n": n0_other}))
        found = _works("one-shard query on server 0", lambda: store.query(BY_N, n=n0_other))
        assert [e["id"] for e in found] == [zero[2]["id"]]

        # Everything that touches it fails in time (all at once: each has its own
        # connection, and the suite need not wait for one timeout after another).
        failing: dict[str, Callable[[], object]] = {
            "get": lambda: store.get(one[0]["id"]),
            "get_many over both servers": lambda: store.get_many([zero[0]["id"], one[1]["id"]]),
            "put": lambda: store.put({"id": one[1]["id"], "n": n0_free}),
            "put whose index row is on the frozen server": lambda: store.put(
                {"id": zero[1]["id"], "n": n1_free}
            ),
            "delete": lambda: store.delete(one[2]["id"]),
            "update": lambda: store.update(one[0]["id"], lambda e: {**(e or {}), "x": 1}),
            "scatter query": lambda: store.query(BY_N, n__gte=0),
            "one-shard query": lambda: store.query(BY_N, n=one[0]["n"]),
            "iter": lambda: list(store.iter(BY_N, n__gte=0)),
        }
        with ThreadPoolExecutor(len(failing)) as pool:
            futures = {what: pool.submit(_fails_in_time, what, fn) for what, fn in failing.items()}
        for future in futures.values():
            future.result()
    finally:
        fault_cluster.resume_server(1)

    # Awake: every operation works again once a probe found it answering, and nothing
    # was torn.  The put sent to the frozen server may have been applied when it woke
    # up (OutcomeUnknown semantics).
    thawed(store)
    got = store.get(one[1]["id"])
    assert got is not None and got["n"] in (one[1]["n"], n0_free)
    assert store.delete(one[1]["id"]) is True
    assert store.get(zero[1]["id"]) == zero[1]  # step 1 failed: step 2 never ran
    store.put({"id": one[0]["id"], "n": n1_free})
    assert [e["id"] for e in store.query(BY_N, n=n1_free)] == [one[0]["id"]]
    assert all(not d.missing and not d.behind for d in diff_indexes(store).values())


def test_partial_query_skips_candidates_stored_on_the_frozen_server(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    """An index row on the live server whose entity lives on the frozen one: a partial
    query does not fail, it names the entity's shard as missing."""
    store = fault_store([BY_N])
    (n0,) = values_on(store, BY_N, 0, 1, start=100)
    zero, one = ids_on(store, 0, 1)[0], ids_on(store, 1, 1)[0]
    store.put_many([{"id": zero, "n": n0}, {"id": one, "n": n0}])  # both rows on server 0
    fault_cluster.pause_server(1)
    try:
        elapsed, page = timed(lambda: store.query(BY_N, n=n0, partial=True))
    finally:
        fault_cluster.resume_server(1)
    assert not isinstance(page, BaseException), f"partial query raised {page!r}"
    assert elapsed < TIMEOUT + MARGIN
    assert [e["id"] for e in page] == [zero]
    assert store.cluster.shard_of_id(one) in page.missing_shards


def test_a_write_that_timed_out_may_still_apply_when_the_server_wakes_up(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    """The batch reached the frozen server's socket before the client gave up: it runs
    when the server wakes up.  The caller was told OutcomeUnknown, and a retry with the
    same expect_version is refused as a conflict, because the first one applied."""
    store = fault_store()
    (key,) = ids_on(store, 1, 1)
    v1 = store.put({"id": key, "n": 1}, expect_version=0)
    fault_cluster.pause_server(1)
    try:
        error = _fails_in_time("put", lambda: store.put({"id": key, "n": 2}, expect_version=v1))
    finally:
        fault_cluster.resume_server(1)
    assert isinstance(error, OutcomeUnknown)
    thawed(store)
    wait_for(lambda: (store.get(key) or {}).get("n") == 2, what="the queued write to apply")
    with pytest.raises(ConflictError) as info:
        store.put({"id": key, "n": 2}, expect_version=v1)
    assert info.value.current_version == v1 + 1


def test_partial_is_for_unreachable_servers_only(
    fault_store: Callable[..., DataStore],
) -> None:
    """A missing index table (as while its shard is being moved) is not an unreachable
    server: a partial query raises TableMissing, which lets the reroute logic refresh
    the map and retry, instead of reporting the shards missing.  Fix: in ``_scan``,
    raise the errors of ``fanout_partial`` that are not ShardUnavailable."""
    store = fault_store([BY_N])
    (n0,) = values_on(store, BY_N, 0, 1, start=100)
    store.put({"id": ids_on(store, 0, 1)[0], "n": n0})
    shard = store.cluster.topology.shards_of(1)[0]
    with moved_away(store, shard, BY_N.table), pytest.raises(TableMissing):
        store.query(BY_N, n__gte=0, partial=True)
