"""Fixtures of the fault suite: a durable cluster of its own, which tests may kill and
freeze without disturbing the session cluster of the other tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import drop_datastore

from schemaless import DataStore, Index
from schemaless.local import LocalCluster

from .helpers import open_store, scratch_cluster, thawed

#: The timeouts of the fault suite's datastores (seconds): operations on a frozen server
#: must fail within about this long.
TIMEOUT = 1.0


@pytest.fixture(scope="session")
def fault_cluster() -> Iterator[LocalCluster]:
    """Two durable servers (innodb_flush_log_at_trx_commit=1) for the fault tests."""
    with scratch_cluster("faults", servers=2, durable=True) as cluster:
        yield cluster


def revive(cluster: LocalCluster) -> None:
    """Every server of ``cluster`` running and not frozen."""
    for s in cluster.servers:
        if s.pid() is None:
            cluster.start_server(s.index)
        else:
            cluster.resume_server(s.index)


@pytest.fixture
def fault_store(fault_cluster: LocalCluster) -> Iterator[Callable[..., DataStore]]:
    """A factory of datastores on the fault cluster with short timeouts; the servers are
    revived (resumed, restarted) after the test and the datastores dropped."""
    revive(fault_cluster)
    stores: list[DataStore] = []

    def make(indexes: tuple[Index, ...] | list[Index] = (), **kwargs: Any) -> DataStore:
        for name in ("connect_timeout", "read_timeout", "write_timeout"):
            kwargs.setdefault(name, TIMEOUT)
        store = open_store(fault_cluster, indexes, **kwargs)
        stores.append(store)
        return store

    yield make
    revive(fault_cluster)
    for store in stores:
        thawed(store)  # a server marked down is used again once its probe gets an answer
        drop_datastore(store)
