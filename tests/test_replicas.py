"""Read replicas: a real MariaDB replica of server 0 in a local cluster of its own.

The datastore lives on two primaries; server 0 has one GTID replica, registered in
the catalog.  A tracer records the server (``host:port``) of every round trip, which
shows where each read went.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from schemaless import DataStore, Index, SchemalessError, new_id
from schemaless.cleaner.daemon import Cleaner
from schemaless.cleaner.verify import diff_indexes
from schemaless.dsn import Address
from schemaless.hashing import shard_of
from schemaless.index import key_encode
from schemaless.local import LocalCluster, LocalClusterError, LocalServer
from schemaless.move import ShardMover

PREFIX = "rep"
BY_USER = Index("by_user", {"user": "int", "n": "int"}, shard_on="user")
BY_FEED = Index("by_feed", {"feed": "int", "n": "int"}, shard_on="n")  # scatters on feed


class Trace:
    """The tracer: ``(server, sql)`` of every round trip, catalog reads set apart."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, server: str, sql: str, seconds: float) -> None:
        with self._lock:
            self.calls.append((server, sql))

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()

    def servers(self, *, catalog: bool = False) -> set[str]:
        """Servers that were sent data statements (and catalog ones if asked)."""
        with self._lock:
            return {s for s, sql in self.calls if catalog or f"{PREFIX}_catalog" not in sql}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Two primaries and a replica of server 0, in a short /tmp path (sockets)."""
    base = Path(tempfile.mkdtemp(prefix="slrep-", dir="/tmp"))
    cluster = LocalCluster(base, servers=2, replicas=1, durable=False)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return Trace()


@pytest.fixture(scope="module")
def store(cluster: LocalCluster, trace: Trace) -> Iterator[DataStore]:
    """The datastore on the two primaries, with the replica registered."""
    ds = DataStore(
        cluster.addresses,
        [BY_USER, BY_FEED],
        prefix=PREFIX,
        shards=8,
        option_file=str(cluster.option_file),
        refresh_interval=0.2,
        tracer=trace,
    )
    ds.cluster.catalog.add_replica(0, Address("127.0.0.1", cluster.replicas[0].port))
    ds.cluster.refresh()
    yield ds
    ds.close()


def open_store(cluster: LocalCluster, trace: Trace, **kwargs: Any) -> DataStore:
    """Another client of the same datastore (its own replica-lag cache)."""
    return DataStore(
        [cluster.addresses[0]],
        prefix=PREFIX,
        create=False,
        option_file=str(cluster.option_file),
        tracer=trace,
        **kwargs,
    )


def names(cluster: LocalCluster) -> tuple[str, str, str]:
    """``host:port`` of server 0, server 1 and the replica."""
    s0, s1 = cluster.addresses
    return s0, s1, cluster.replica_addresses[0]


def ids_on(store: DataStore, server_id: int, n: int) -> list[bytes]:
    """``n`` new ids whose logical shard lives on ``server_id``."""
    topo = store.cluster.current()
    out: list[bytes] = []
    while len(out) < n:
        key = new_id()
        if topo.shard_servers[store.cluster.shard_of_id(key)] == server_id:
            out.append(key)
    return out


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_replica_replicates_the_datastore_and_refuses_writes(
    cluster: LocalCluster, store: DataStore
) -> None:
    topo = store.cluster.current()
    assert topo.replicas == {0: (Address("127.0.0.1", cluster.replicas[0].port),)}
    cluster.wait_replicated(0)
    replica = store.cluster.server(topo.replicas[0][0])
    rows = replica.run(
        "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name LIKE %s",
        (f"{PREFIX}\\_%",),
    )[0]
    # the catalog and the data database (a database per shard: server 0's shards)
    assert rows[0][0] == 1 + (1 if topo.owned_db else len(topo.shards_of(0)))
    assert replica.replica_lag() == 0.0
    with pytest.raises(SchemalessError):
        replica.run(f"DELETE FROM `{PREFIX}_catalog`.`replicas`")
    status = cluster.replication_status(0)
    assert status["Using_Gtid"] == "Slave_Pos"
    assert (status["Slave_IO_Running"], status["Slave_SQL_Running"]) == ("Yes", "Yes")


def server_options(server: LocalServer) -> dict[str, str]:
    """The ``[mysqld]`` options of a server's my.cnf (flags map to "")."""
    text = server.config_file.read_text().split("[client]")[0]
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def test_binlog_server_ids_and_read_only(cluster: LocalCluster) -> None:
    primary, other = (server_options(s) for s in cluster.servers)
    replica = server_options(cluster.replicas[0])
    assert len({primary["server-id"], other["server-id"], replica["server-id"]}) == 3
    assert primary["log-bin"] and primary["binlog-format"] == "ROW"
    assert "skip-log-bin" in other and "log-bin" not in other  # no replica: no binlog
    assert replica["read_only"] == "1"
    again = LocalCluster(cluster.base_dir)  # found again through the state file
    assert again.replica_addresses == cluster.replica_addresses
    assert [r.replica_of for r in again.replicas] == [0]
    assert cluster.replication_file.stat().st_mode & 0o777 == 0o600


def test_a_primary_with_data_gets_no_replica(cluster: LocalCluster, store: DataStore) -> None:
    with pytest.raises(LocalClusterError, match="already holds databases"):
        cluster.add_replica(1)  # server 1 holds shards: a new replica would miss them
    assert len(LocalCluster(cluster.base_dir).replicas) == 1
    assert not (cluster.base_dir / "replica1").exists()


def test_writes_go_to_primaries_and_replica_reads_see_them(
    cluster: LocalCluster, store: DataStore, trace: Trace
) -> None:
    s0, s1, replica = names(cluster)
    keys = ids_on(store, 0, 5)
    trace.clear()
    store.put_many({"id": k, "user": 1, "n": i} for i, k in enumerate(keys))
    assert trace.servers(catalog=True) <= {s0, s1}
    wait_for(lambda: all(e is not None for e in store.get_many(keys, consistency="replica")))
    trace.clear()
    got = store.get_many(keys, consistency="replica")
    assert [e["n"] for e in got if e is not None] == list(range(5))
    assert trace.servers() == {replica}


def test_read_your_writes_by_default(cluster: LocalCluster, store: DataStore, trace: Trace) -> None:
    replica = names(cluster)[2]
    (key,) = ids_on(store, 0, 1)
    for n in range(30):
        trace.clear()
        version = store.put({"id": key, "user": 2, "n": n})
        got = store.get(key)
        assert got is not None and got["n"] == n and got.version == version
        assert replica not in trace.servers(catalog=True)


def test_stopped_replication_falls_back_to_the_primary(
    cluster: LocalCluster, store: DataStore, trace: Trace
) -> None:
    s0 = names(cluster)[0]
    store.flush()  # the module's client shares the tracer: its step 3 of earlier tests done
    cluster.stop_replication(0)
    try:
        ds = open_store(cluster, trace)
        (key,) = ids_on(ds, 0, 1)
        ds.put({"id": key, "user": 3, "n": 1})
        trace.clear()
        got = ds.get(key, consistency="replica")  # Seconds_Behind_Master is NULL
        assert got is not None and got["n"] == 1
        assert trace.servers() == {s0}
        ds.close()
    finally:
        cluster.start_replication(0)
    cluster.wait_replicated(0)


def test_lag_beyond_the_bound_falls_back_to_the_primary(
    cluster: LocalCluster, store: DataStore, trace: Trace
) -> None:
    s0, _, replica = names(cluster)
    cluster.wait_replicated(0)
    cluster.start_replication(0, delay=60)  # MASTER_DELAY: real, growing lag
    try:
        (key,) = ids_on(store, 0, 1)
        store.put({"id": key, "user": 4, "n": 1})
        assert store.get(key) is not None  # read-your-writes: the primary has it
        wait_for(lambda: (cluster.replication_status(0)["Seconds_Behind_Master"] or 0) >= 2)

        strict = open_store(cluster, trace, max_replica_lag=1.0)
        trace.clear()
        got = strict.get(key, consistency="replica")
        assert got is not None and got["n"] == 1
        assert trace.servers() == {s0}
        strict.close()

        loose = open_store(cluster, trace, max_replica_lag=3600.0)
        trace.clear()
        assert loose.get(key, consistency="replica") is None  # stale, within the bound
        assert trace.servers() == {replica}
        loose.close()
    finally:
        cluster.start_replication(0, delay=0)
    cluster.wait_replicated(0)
    assert store.get(key, consistency="replica") is not None


def test_replica_down_falls_back_to_the_primary(cluster: LocalCluster, trace: Trace) -> None:
    s0, _, _ = names(cluster)
    cluster.stop_replica(0)
    try:
        ds = open_store(cluster, trace, connect_timeout=2.0)
        (key,) = ids_on(ds, 0, 1)
        ds.put({"id": key, "user": 5, "n": 1})
        trace.clear()
        got = ds.get(key, consistency="replica")
        assert got is not None and got["n"] == 1
        assert trace.servers() == {s0}
        ds.close()
    finally:
        cluster.start_replica(0)
    cluster.wait_replicated(0)


def test_queries_read_from_the_replica(
    cluster: LocalCluster, store: DataStore, trace: Trace
) -> None:
    s0, s1, replica = names(cluster)
    store.put_many({"id": new_id(), "feed": 7, "n": n} for n in range(40))
    cluster.wait_replicated(0)
    topo = store.cluster.current()
    assert topo.shards_of(0) and topo.shards_of(1)
    trace.clear()
    page = store.query(BY_FEED, feed=7, limit=100, consistency="replica")  # scatter
    assert sorted(e["n"] for e in page) == list(range(40))
    assert trace.servers() == {replica, s1}  # server 0's shards answered by its replica
    trace.clear()
    assert [e["n"] for e in store.iter(BY_FEED, feed=7, page_size=15, consistency="replica")] == (
        list(range(40))
    )
    assert s0 not in trace.servers()
    (key,) = ids_on(store, 0, 1)  # the entity and its index row both on server 0
    user = next(u for u in range(1000, 2000) if _user_server(store, u) == 0)
    store.put({"id": key, "user": user, "n": 9})
    cluster.wait_replicated(0)
    trace.clear()
    (one,) = store.query(BY_USER, user=user, consistency="replica")
    assert one["n"] == 9
    assert trace.servers() == {replica}


def _user_server(store: DataStore, user: int) -> int:
    topo = store.cluster.current()
    return topo.shard_servers[shard_of(key_encode(user), topo.n_shards)]


def test_the_cleaner_never_reads_from_replicas(
    cluster: LocalCluster, store: DataStore, trace: Trace
) -> None:
    s0, s1, replica = names(cluster)
    cluster.wait_replicated(0)
    trace.clear()
    diffs = diff_indexes(store)
    assert all(d.clean for d in diffs.values()), {n: d.summary() for n, d in diffs.items()}
    cleaner = Cleaner(store, fence_after=0.0)
    cleaner.run_once()
    servers = trace.servers(catalog=True)
    assert servers == {s0, s1}
    assert replica not in servers


def test_a_shard_moved_to_a_replicated_server_is_read_whole_from_its_replica(
    cluster: LocalCluster, store: DataStore, trace: Trace
) -> None:
    """A move copies old rows: they are new to the target's binary log. The mover waits
    for the target's replicas to apply the copy before it flips the map, so a replica
    read right after the move finds rows written long before it (it used to miss them
    while the replica, within its lag bound, was still applying the copy)."""
    replica = names(cluster)[2]
    shard = store.cluster.current().shards_of(1)[0]
    keys: list[bytes] = []
    while len(keys) < 30:
        key = new_id()
        if store.cluster.shard_of_id(key) == shard:
            keys.append(key)
    store.put_many({"id": k, "user": 6, "n": i} for i, k in enumerate(keys))
    cluster.wait_replicated(0)
    cluster.start_replication(0, delay=2)  # every event applied 2 s late
    loose = open_store(cluster, trace, max_replica_lag=3600.0)
    try:
        ShardMover(store).move(shard, 0)
        trace.clear()
        got = loose.get_many(keys, consistency="replica")
        assert trace.servers() == {replica}
        assert [e["n"] if e else None for e in got] == list(range(30))
    finally:
        loose.close()
        cluster.start_replication(0, delay=0)
        cluster.wait_replicated(0)
        ShardMover(store).move(shard, 1)
        ShardMover(store).drop_old_copies()
    assert store.cluster.refresh().shard_servers[shard] == 1
