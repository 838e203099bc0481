"""Step 3 in the background: stale index rows are deleted off the writers' path."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import shard_rows

from schemaless import DataStore, Index, new_id
from schemaless.local import LocalCluster
from schemaless.stale import StaleRows

BY_N = Index("by_n", {"n": "int"}, shard_on="n")


class Held:
    """A delete function that waits while ``gate`` is clear, records its batches, then
    fails (``fail``) or passes them on (``then``)."""

    def __init__(self, fail: bool = False, then: Callable[[list[Any]], None] | None = None) -> None:
        self.gate = threading.Event()
        self.batches: list[tuple[list[Any], str]] = []
        self.fail = fail
        self.then = then

    def __call__(self, rows: list[Any]) -> None:
        self.gate.wait(10)
        self.batches.append((rows, threading.current_thread().name))
        if self.fail:
            raise RuntimeError("boom")
        if self.then is not None:
            self.then(rows)


def test_rows_are_deleted_in_the_background_and_flush_waits() -> None:
    held = Held()
    stale = StaleRows(held, max_pending=10, batch=4)
    stale.submit([1, 2, 3])
    stale.submit([4, 5])
    assert not stale.flush(timeout=0.05)  # the thread is held
    held.gate.set()
    assert stale.flush(timeout=5)
    deleted = [row for rows, _ in held.batches for row in rows]
    assert sorted(deleted) == [1, 2, 3, 4, 5]
    assert all(len(rows) <= 4 for rows, _ in held.batches)
    assert {name for _, name in held.batches} == {"schemaless-stale-rows"}
    stale.close()


def test_a_batch_waits_briefly_for_more_writes_rows() -> None:
    held = Held()
    held.gate.set()
    stale = StaleRows(held, linger=5)
    stale.submit([1])
    stale.submit([2])
    assert stale.flush(timeout=2)  # cuts the wait short
    assert [rows for rows, _ in held.batches] == [[1, 2]]
    quick = StaleRows(held, linger=0.01)
    quick.submit([3])
    time.sleep(0.5)  # no flush: the batch goes once the linger is over
    assert [rows for rows, _ in held.batches] == [[1, 2], [3]]
    stale.close()
    quick.close()


def test_a_full_queue_makes_the_writer_delete_its_own_rows() -> None:
    held = Held()
    stale = StaleRows(held, max_pending=3)
    stale.submit([1, 2, 3])
    held.gate.set()
    stale.submit([4, 5, 6, 7])  # more than max_pending
    assert ([4, 5, 6, 7], threading.current_thread().name) in held.batches
    assert stale.flush(timeout=5)
    stale.close()


def test_a_failed_batch_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    held = Held(fail=True)
    held.gate.set()
    stale = StaleRows(held, batch=1)
    with caplog.at_level(logging.ERROR, logger="schemaless.stale"):
        stale.submit([1, 2])
        assert stale.flush(timeout=5)
    assert [rows for rows, _ in held.batches] == [[1], [2]]
    assert "left for the Cleaner" in caplog.text
    stale.close()


def test_close_deletes_what_is_queued_then_deletes_at_once() -> None:
    held = Held()
    stale = StaleRows(held)
    stale.submit([1])
    threading.Timer(0.05, held.gate.set).start()
    stale.close()
    assert [rows for rows, _ in held.batches] == [[1]]
    stale.submit([2])
    assert held.batches[-1] == ([2], threading.current_thread().name)


def _index_rows(store: DataStore) -> list[tuple[int, bytes]]:
    """Every row of ``by_n``, read with SQL (no flush first)."""
    topo = store.cluster.refresh()
    out = []
    for shard in range(topo.n_shards):
        rows = shard_rows(store, shard, "index_by_n", "p_n, entity_id")
        out += [(int(n), bytes(key)) for n, key in rows]
    return sorted(out)


def test_a_query_never_returns_a_stale_row_still_waiting(make_store: Any) -> None:
    store = make_store(indexes=[BY_N])
    key = new_id()
    store.put({"id": key, "n": 1})
    held = Held(then=store._writer.stale._delete)
    store._writer.stale._delete = held  # hold step 3
    store.put({"id": key, "n": 2})
    assert _index_rows(store) == sorted([(1, key), (2, key)])  # the stale row is there
    assert store.query("by_n", n=1) == []
    assert [e["id"] for e in store.query("by_n", n=2)] == [key]
    held.gate.set()
    assert store.flush(timeout=10)
    assert (1, key) not in _index_rows(store)


def test_close_deletes_the_queued_rows(make_store: Any, local_cluster: LocalCluster) -> None:
    reader = make_store(indexes=[BY_N])
    writer = DataStore(
        local_cluster.addresses,
        prefix=reader.cluster.topology.prefix,
        option_file=str(local_cluster.option_file),
    )
    keys = [new_id() for _ in range(20)]
    writer.put_many([{"id": k, "n": 1} for k in keys])
    writer.put_many([{"id": k, "n": 2} for k in keys])
    writer.delete_many(keys[:5])
    writer.close()
    assert _index_rows(reader) == sorted((2, k) for k in keys[5:])


def test_a_script_that_ends_without_close_deletes_its_stale_rows(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    reader = make_store(indexes=[BY_N])
    script = (
        "import sys\n"
        "from schemaless import DataStore\n"
        "store = DataStore(sys.argv[1:3], prefix=sys.argv[3], option_file=sys.argv[4])\n"
        "store._writer.stale._linger = 5.0  # still queued when the script ends\n"
        "for n in (1, 2):\n"
        "    store.put({'id': bytes(16), 'n': n})\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            *local_cluster.addresses,
            reader.cluster.topology.prefix,
            str(local_cluster.option_file),
        ],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert _index_rows(reader) == [(2, bytes(16))]


def test_an_idle_thread_ends_and_the_next_rows_start_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("schemaless.stale.IDLE_EXIT", 0.05)
    held = Held()
    held.gate.set()
    stale = StaleRows(held, linger=0)
    stale.submit([1])
    assert stale.flush(timeout=5)
    time.sleep(0.5)
    assert stale._thread is None  # ended: nothing holds the datastore alive
    stale.submit([2])
    assert stale.flush(timeout=5)
    assert [rows for rows, _ in held.batches] == [[1], [2]]
    stale.close()
