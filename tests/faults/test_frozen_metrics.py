"""A frozen server (SIGSTOP) shows in the client's health gauge, and its failed calls
in the error counter; thawed, the gauge goes back to 0."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from schemaless import DataStore, TransientError, metrics
from schemaless.local import LocalCluster

from .helpers import ids_on, thawed


def test_a_frozen_server_shows_in_the_health_gauge(
    fault_store: Callable[..., DataStore], fault_cluster: LocalCluster
) -> None:
    store = fault_store()
    registry = CollectorRegistry()
    metrics.instrument(store, registry=registry)
    key = ids_on(store, 1, 1)[0]
    store.put({"id": key, "n": 1})
    frozen = next(
        s.name for s in store.cluster.servers() if s.address.port == fault_cluster.servers[1].port
    )

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value("schemaless_client_" + name, labels)

    assert value("server_down", server=frozen) == 0
    fault_cluster.pause_server(1)
    try:
        with pytest.raises(TransientError):
            store.get(key)
        assert value("server_down", server=frozen) == 1
        assert value("server_downs_total", server=frozen) == 1
        errors = [
            value("errors_total", verb="get", error=name) or 0
            for name in ("ShardTimeout", "ShardUnavailable")
        ]
        assert sum(errors) == 1
    finally:
        fault_cluster.resume_server(1)
    thawed(store)
    assert value("server_down", server=frozen) == 0
