"""A partial change feed across an outage, in one process (``ChangeFeed(partial=True)``,
what ``schemaless changes --partial --follow`` reads): the sick server's shards wait
at their positions, the others go on, and once it answers again its changes come,
each once, in the same feed."""

from __future__ import annotations

from collections.abc import Callable

from schemaless import DataStore
from schemaless.feed import ChangeFeed, open_feed
from schemaless.local import LocalCluster

from .helpers import ids_on, thawed, wait_for

SICK = 1  # server 0 holds the catalog


def test_a_partial_feed_waits_for_a_stopped_server_and_reads_it_when_it_answers(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    store = fault_store(changes=True)
    (healthy,), (sick,) = ids_on(store, 0, 1), ids_on(store, SICK, 1)
    feed = open_feed(store.reader, partial=True)
    store.put({"id": healthy, "n": 1})
    store.put({"id": sick, "n": 1})
    seen = [e.id for e in feed.events()]
    assert sorted(seen) == sorted([healthy, sick]) and feed.unreachable == {}
    fault_cluster.stop_server(SICK)
    store.put({"id": healthy, "n": 2})
    assert [(e.id, e.entity) for e in feed.events()] == [(healthy, {"id": healthy, "n": 2})]
    sick_shards = store.cluster.current().shards_of(SICK)
    assert feed.unreachable == {fault_cluster.addresses[SICK]: sick_shards}
    fault_cluster.start_server(SICK)
    thawed(store)  # the server marked down is used again once its probe answers
    store.put({"id": sick, "n": 2})
    got: list[bytes] = []
    wait_for(lambda: bool(got.extend(e.id for e in feed.events())) or sick in got)
    assert got == [sick] and feed.unreachable == {}


def test_a_subscription_acknowledged_during_an_outage_keeps_the_sick_shards(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """``sub.changes(partial=True)``: acknowledging an event read while a server is down
    never moves that server's shards, so a restart reads their changes."""
    store = fault_store(changes=True)
    (healthy,), (sick,) = ids_on(store, 0, 1), ids_on(store, SICK, 1)
    sub = store.subscribe("indexer")
    store.put({"id": sick, "n": 1})  # not read before the outage
    fault_cluster.stop_server(SICK)
    store.put({"id": healthy, "n": 1})
    (event,) = sub.changes(partial=True)
    assert event.id == healthy
    sub.ack(event)
    fault_cluster.start_server(SICK)
    thawed(store)
    assert [e.id for e in store.subscribe("indexer").changes()] == [sick]


def test_a_partial_snapshot_reads_every_shard_of_the_servers_that_answer(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore]
) -> None:
    """``changes(snapshot=True, partial=True)`` scans one shard at a time: with the
    first shard's server stopped it goes on with the shards of the other (it used to
    stop there), names every shard that waits, and the cursor reads them once it
    answers: every live entity once."""
    store = fault_store(changes=True)
    topo = store.cluster.current()
    healthy, sick = ids_on(store, 0, 12), ids_on(store, SICK, 12)
    store.put_many([{"id": k, "n": 1} for k in healthy + sick])
    fault_cluster.stop_server(SICK)
    order = [*topo.shards_of(SICK), *topo.shards_of(0)]  # the scan meets the sick first
    feed = ChangeFeed(store.reader, {s: (None, 0) for s in order}, order, partial=True)
    seen = list(feed.events())
    assert sorted(e.id for e in seen) == sorted(healthy)
    assert feed.unreachable == {fault_cluster.addresses[SICK]: topo.shards_of(SICK)}
    fault_cluster.start_server(SICK)
    thawed(store)
    rest = list(store.changes(seen[-1].cursor))
    assert sorted(e.id for e in rest) == sorted(sick)
