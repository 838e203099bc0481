"""A datastore opened before a fork (pre-fork servers, ``multiprocessing`` with
``fork``): the children and the parent go on using it side by side."""

from __future__ import annotations

import os
import threading
from typing import Any

from schemaless import Index, new_id

BY_N = Index("by_n", {"n": "int"})


def _child(store: Any, keys: list[bytes], seed: int) -> int:
    """Reads, writes and queries of the inherited datastore; the exit status."""
    try:
        for r in range(150):
            key = keys[(r * 7 + seed) % len(keys)]
            got = store.get(key)
            assert got is not None and got["id"] == key, (key, got)
            store.put({"id": key, "n": got["n"]})
            page = store.query(BY_N, n=got["n"])
            assert key in {e["id"] for e in page}
        assert store.flush(timeout=10)  # its own stale-row worker
        store.close()
        return 0
    except BaseException as exc:  # reported through the exit status
        print(f"child {seed}: {exc!r}", flush=True)
        return 1


def test_children_forked_with_an_open_datastore_use_it_beside_the_parent(
    make_store: Any,
) -> None:
    """Every child and the parent get their own answers (the children used to share the
    parent's pooled connections, and read each other's replies), and the parent's
    sessions outlive the children closing theirs."""
    store = make_store(indexes=[BY_N])
    keys = [new_id() for _ in range(40)]
    store.put_many({"id": k, "n": i} for i, k in enumerate(keys))
    for i, key in enumerate(keys[:10]):
        store.put({"id": key, "n": 100 + i})  # the stale-row worker thread is running
    stop = threading.Event()

    def reads() -> None:  # a parent thread using the pool while the children are forked
        while not stop.is_set():
            store.get(keys[0])

    busy = threading.Thread(target=reads)
    busy.start()
    pids = []
    try:
        for seed in range(3):
            pid = os.fork()
            if pid == 0:
                os._exit(_child(store, keys, seed))
            pids.append(pid)
        for r in range(300):
            key = keys[r % len(keys)]
            got = store.get(key)
            assert got is not None and got["id"] == key
    finally:
        stop.set()
        busy.join()
        statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    assert statuses == [0, 0, 0]
    assert [e["id"] for e in store.get_many(keys) if e is not None] == keys
