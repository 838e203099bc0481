"""Client metrics (prometheus_client) and spans (OpenTelemetry) against real servers,
read with the libraries' own registry and in-memory exporter."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from schemaless import ConflictError, DataStore, Index, metrics, tracing
from schemaless.cleaner.metrics import MetricsServer

BY_TAG = Index("by_tag", {"tag": "str(64)"})
SECRET = "zebra-secret-value-9271"


def test_calls_show_up_in_the_registry_by_verb_and_server(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store([BY_TAG])
    registry = CollectorRegistry()
    metrics.instrument(store, registry=registry)
    entity = {"tag": SECRET}
    store.put(entity)
    assert store.get(entity["id"]) == entity
    assert [e["id"] for e in store.query(BY_TAG, tag=SECRET)] == [entity["id"]]
    with pytest.raises(ConflictError):
        store.put({"id": entity["id"], "tag": "x"}, expect_version=0)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value("schemaless_client_" + name, labels)

    for verb in ("get", "query"):
        assert value("call_seconds_count", verb=verb) == 1
    assert value("call_seconds_count", verb="put") == 2
    servers = {s.name for s in store.cluster.servers()}
    gets = {s: value("statement_seconds_count", verb="get", server=s) for s in servers}
    assert sum(n or 0 for n in gets.values()) == 1, gets  # one round trip, to one server
    queries = [value("statement_seconds_count", verb="query", server=s) for s in servers]
    assert sum(n or 0 for n in queries) >= 1
    assert value("errors_total", verb="put", error="ConflictError") == 1
    assert value("errors_total", verb="get", error="ConflictError") is None
    for server in servers:
        assert value("pool_in_use", server=server) == 0
        assert value("pool_waiting", server=server) == 0
        assert value("server_down", server=server) == 0
    text = "".join(str(m) for m in registry.collect())
    assert SECRET not in text


def test_spans_carry_the_conventions_and_no_entity_data(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store([BY_TAG])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(store, tracer_provider=provider)
    entity = {"tag": SECRET}
    store.put(entity)
    store.get(entity["id"])
    store.query(BY_TAG, tag=SECRET)
    with pytest.raises(ConflictError):
        store.put({"id": entity["id"], "tag": SECRET}, expect_version=0)
    spans = exporter.get_finished_spans()

    calls = [s for s in spans if s.parent is None]
    assert [s.name for s in calls] == ["put", "get", "query", "put"]
    for span in calls:
        assert span.kind == SpanKind.CLIENT
        attrs = span.attributes or {}
        assert attrs["db.system"] == "mariadb" and attrs["db.operation.name"] == span.name
        assert attrs["db.namespace"] == store.cluster.catalog.prefix
    assert (calls[-1].attributes or {})["error.type"] == "ConflictError"
    assert not calls[-1].status.is_ok and not calls[-1].events  # no message recorded

    addresses = {(s.address.host, s.address.port) for s in store.cluster.servers()}
    by_parent = {c.context.span_id: c for c in calls}
    statements = [s for s in spans if s.parent is not None]
    assert statements
    for span in statements:
        attrs = span.attributes or {}
        assert span.parent is not None and span.parent.span_id in by_parent
        assert (attrs["server.address"], attrs["server.port"]) in addresses
        assert attrs["db.system"] == "mariadb"
        assert re.fullmatch(r"[A-Z]+(;[A-Z]+)*", str(attrs["db.operation.name"]))
        assert span.name == attrs["db.operation.name"]
    assert any("SELECT" in s.name for s in statements)
    _assert_absent(spans, SECRET, entity["id"].hex())


def test_not_instrumented_costs_nothing(make_store: Callable[..., DataStore]) -> None:
    """A datastore nobody observes runs the verbs and hooks it ran before."""
    store = make_store()
    store.put({"a": 1})
    assert "_observers" not in vars(store)
    assert "get" not in vars(store) and "put" not in vars(store)
    assert all(s.tracer is None and s.on_retry is None for s in store.cluster.servers())


def test_metrics_and_tracing_together_see_each_call_once(
    make_store: Callable[..., DataStore],
) -> None:
    seen: list[str] = []
    store = make_store(tracer=lambda server, sql, seconds: seen.append(server))
    registry = CollectorRegistry()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics.instrument(store, registry=registry)
    tracing.instrument(store, tracer_provider=provider)
    store.put({"a": 1})
    assert registry.get_sample_value("schemaless_client_call_seconds_count", {"verb": "put"}) == 1
    assert [s.name for s in exporter.get_finished_spans() if s.parent is None] == ["put"]
    assert seen  # the application's own tracer still runs


def _assert_absent(spans: tuple[ReadableSpan, ...], *values: str) -> None:
    for span in spans:
        texts = [span.name, *map(str, (span.attributes or {}).values())]
        for value in values:
            assert not any(value in t for t in texts), f"{value!r} in span {span.name}"


def test_without_the_extras_a_clear_error_and_nothing_attached(
    make_store: Callable[..., DataStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"pip install 'schemaless-mysql\[metrics\]'"):
        metrics.instrument(store)
    with pytest.raises(ImportError, match=r"pip install 'schemaless-mysql\[tracing\]'"):
        tracing.instrument(store)
    with pytest.raises(ImportError, match=r"schemaless-mysql\[metrics\]"):
        MetricsServer(list, 0)
    assert "_observers" not in vars(store) and store.cluster.tracer is None


def test_a_retry_is_counted_by_server_and_error(make_store: Callable[..., DataStore]) -> None:
    """A lock wait timeout (the server rolled back) is retried; the counter sees it,
    and the span under way gets a ``retry`` event."""
    store = make_store()
    registry = CollectorRegistry()
    metrics.instrument(store, registry=registry)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(store, tracer_provider=provider)
    server = store.cluster.servers()[0]
    db = "t_obs_retry_" + store.cluster.catalog.prefix
    table = f"{db}.t"
    server.run(f"CREATE DATABASE {db}; CREATE TABLE {table} (a INT PRIMARY KEY)")
    server.run(f"INSERT INTO {table} VALUES (1)")
    held = threading.Event()

    def hold_the_row() -> None:
        with server.connection() as conn:
            conn.query("START TRANSACTION")
            conn.query(f"SELECT a FROM {table} WHERE a = 1 FOR UPDATE")
            conn.store_result()
            held.set()
            time.sleep(1.5)
            conn.query("COMMIT")

    thread = threading.Thread(target=hold_the_row)
    thread.start()
    try:
        assert held.wait(5)
        sql = (
            f"SET SESSION innodb_lock_wait_timeout = 1; SELECT a FROM {db}.t WHERE a = 1 FOR UPDATE"
        )
        with provider.get_tracer("test").start_as_current_span("outer"):
            assert server.run(sql) == [((1,),)]
    finally:
        thread.join()
        server.run(f"DROP DATABASE {db}")
    labels = {"server": server.name, "error": "ShardUnavailable"}
    assert registry.get_sample_value("schemaless_client_retries_total", labels) == 1
    (outer,) = [s for s in exporter.get_finished_spans() if s.name == "outer"]
    assert [(e.name, (e.attributes or {})["error.type"]) for e in outer.events] == [
        ("retry", "ShardUnavailable")
    ]
    bucket = {"verb": "other", "server": server.name, "le": "0.0005"}
    assert (
        registry.get_sample_value("schemaless_client_statement_seconds_bucket", bucket) is not None
    )
