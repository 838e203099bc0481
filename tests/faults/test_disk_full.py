"""A server out of space (its InnoDB data file capped at 12 MB): writes that need space
there fail with StorageFull, nothing is half written, the index stays a superset, the
other server is unaffected, and once the server has room again the same client works."""

from __future__ import annotations

import os
import random
import string
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import drop_datastore

from schemaless import DataStore, Index, StorageFull
from schemaless.cleaner.daemon import Cleaner
from schemaless.cleaner.verify import diff_indexes
from schemaless.local import LocalCluster

from .helpers import count_rows, open_store, row_server, scratch_cluster, server_of_id

CAPPED = {"innodb_data_file_path": "ibdata1:12M", "innodb_file_per_table": "0"}
BY_S = Index("by_s", {"s": "str(700)"})  # wide rows fill index pages fast


@pytest.fixture(scope="module")
def capped_cluster() -> Iterator[LocalCluster]:
    with scratch_cluster("full", servers=2, durable=False, extra_config=CAPPED) as cluster:
        yield cluster


@pytest.fixture
def store(capped_cluster: LocalCluster) -> Iterator[DataStore]:
    store = open_store(capped_cluster, [BY_S], connect_timeout=2, read_timeout=10)
    yield store
    drop_datastore(store)


def make(store: DataStore, rng: random.Random, entity_on: int, row_on: int) -> dict[str, Any]:
    """An entity stored on server ``entity_on`` whose index row lives on ``row_on``."""
    while True:
        key = rng.randbytes(16)
        text = "".join(rng.choices(string.ascii_letters, k=700))
        if server_of_id(store, key) == entity_on and row_server(store, BY_S, (text,)) == row_on:
            return {"id": key, "s": text}


def test_a_full_server_refuses_writes_cleanly(
    store: DataStore, capped_cluster: LocalCluster
) -> None:
    rng = random.Random(5)
    acked: list[dict[str, Any]] = []

    def fill(entity_on: int, row_on: int, blob: int) -> tuple[dict[str, Any], StorageFull]:
        for _ in range(2000):
            entity = {**make(store, rng, entity_on, row_on), "blob": os.urandom(blob)}
            try:
                store.put(entity)
            except StorageFull as exc:
                return entity, exc
            acked.append(entity)
        raise AssertionError("server 1 never filled up")

    # Entity rows on server 1 until its data file is full: step 2 fails there...
    refused, error = fill(1, 0, 200_000)
    assert capped_cluster.addresses[1] in str(error) and "'entities' is full" in str(error)
    assert not error.retryable
    assert store.get(refused["id"]) is None  # nothing half written
    assert not store.query(BY_S, s=refused["s"])  # its index row is an orphan, hidden
    # ... and step 1 fails there too: entities of server 0 whose index row is on 1.
    refused, error = fill(0, 1, 0)
    assert "'index_by_s' is full" in str(error)
    assert store.get(refused["id"]) is None  # step 2 never ran on the healthy server
    assert count_rows(store)["entities"] == len(acked)

    # Server 0 is unaffected, server 1 still serves reads, the index is a superset.
    healthy = make(store, rng, 0, 0)
    store.put(healthy)
    assert store.get(healthy["id"]) == healthy
    assert store.get_many([e["id"] for e in acked]) == acked
    for entity in acked[-3:]:
        assert [e["id"] for e in store.query(BY_S, s=entity["s"])] == [entity["id"]]
    for diff in diff_indexes(store).values():
        assert not diff.missing and not diff.behind

    # Room again (the cap lifted): the same client writes to server 1 again.
    capped_cluster.extra_config["innodb_data_file_path"] = "ibdata1:12M:autoextend"
    try:
        capped_cluster.stop_server(1)
        capped_cluster.start_server(1)
        store.put(refused)
        assert store.get(refused["id"]) == refused
    finally:
        capped_cluster.extra_config.update(CAPPED)
    Cleaner(store, fence_after=0).run_once()
    assert all(d.clean for d in diff_indexes(store).values())
