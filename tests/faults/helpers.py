"""Helpers shared by the fault suite, the bad-input and the security tests."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from click.testing import CliRunner, Result
from conftest import shard_rows

from schemaless import DataStore, Index, new_id
from schemaless.cli.main import cli
from schemaless.hashing import shard_of
from schemaless.local import LocalCluster
from schemaless.names import quote
from schemaless.owned import UNCHECKED, admin

T = TypeVar("T")


@contextlib.contextmanager
def scratch_cluster(name: str, **kwargs: Any) -> Iterator[LocalCluster]:
    """A cluster of its own under a short /tmp path (sockets must stay short), for tests
    that kill, freeze or starve servers; stopped and removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=f"sl-{name}-", dir="/tmp"))
    try:
        cluster = LocalCluster(base, **kwargs)
        try:
            yield cluster.up()
        finally:
            cluster.down(timeout=30)  # SIGCONT too: a frozen server must wake up to stop
    finally:
        shutil.rmtree(base, ignore_errors=True)


def open_store(
    cluster: LocalCluster, indexes: tuple[Index, ...] | list[Index] = (), **kwargs: Any
) -> DataStore:
    """A new datastore (own prefix, 8 logical shards) on ``cluster``."""
    kwargs.setdefault("refresh_interval", 0.2)
    kwargs.setdefault("option_file", str(cluster.option_file))
    kwargs.setdefault("shards", 8)
    return DataStore(cluster.addresses, indexes, prefix="f_" + uuid.uuid4().hex[:12], **kwargs)


def count_rows(store: DataStore) -> dict[str, int]:
    """Rows in every entities and index table, summed over all logical shards."""
    store.flush()  # the stale rows of earlier writes deleted
    topo = store.cluster.refresh()
    tables = ["entities", *sorted(i.index.table for i in topo.indexes.values())]
    return {
        table: sum(int(shard_rows(store, s, table, "COUNT(*)")[0][0]) for s in range(topo.n_shards))
        for table in tables
    }


@contextlib.contextmanager
def moved_away(store: DataStore, shard: int, table: str) -> Iterator[None]:
    """Inside: the logical shard's ``table`` gone from its server, as while the shard
    is moved away (owned layout: its ``owned`` row deleted, so every batch naming the
    shard fails its check; a database per shard: the table renamed); put back after."""
    topo = store.cluster.topology
    server = store.cluster.server_of_shard(topo, shard)
    if topo.owned_db is not None:
        owned = quote(topo.owned_db, "owned")
        gone = f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {int(shard)}"
        back = f"INSERT INTO {owned} (`shard`) VALUES ({int(shard)})"
    else:
        db = topo.dbs[shard]
        gone = f"RENAME TABLE {quote(db, table)} TO {quote(db, 'moved_away')}"
        back = f"RENAME TABLE {quote(db, 'moved_away')} TO {quote(db, table)}"
    server.run(admin([gone]))
    try:
        yield
    finally:
        server.run(admin([back]))


def server_of_id(store: DataStore, key: bytes) -> int:
    """The server id that stores entity ``key``."""
    topo = store.cluster.topology
    return topo.shard_servers[shard_of(key, topo.n_shards)]


def ids_on(store: DataStore, sid: int, n: int) -> list[bytes]:
    """``n`` new entity ids stored on server ``sid``."""
    out: list[bytes] = []
    while len(out) < n:
        key = new_id()
        if server_of_id(store, key) == sid:
            out.append(key)
    return out


def ids_of_shard(store: DataStore, shard: int, n: int) -> list[bytes]:
    """``n`` new entity ids of logical shard ``shard``."""
    out: list[bytes] = []
    while len(out) < n:
        key = new_id()
        if store.cluster.shard_of_id(key) == shard:
            out.append(key)
    return out


def row_server(store: DataStore, index: Index, row: tuple[Any, ...]) -> int:
    """The server id that holds an index row (coerced values)."""
    topo = store.cluster.topology
    return topo.shard_servers[shard_of(index.shard_key(row), topo.n_shards)]


def values_on(store: DataStore, index: Index, sid: int, n: int, start: int = 0) -> list[int]:
    """``n`` int values of a one-property index whose rows live on server ``sid``."""
    out: list[int] = []
    value = start
    while len(out) < n:
        (row,) = index.rows({index.properties[0]: value})
        if row_server(store, index, row) == sid:
            out.append(value)
        value += 1
    return out


def timed(fn: Callable[[], T]) -> tuple[float, T | BaseException]:
    """(seconds, result or the exception raised)."""
    started = time.monotonic()
    try:
        result: T | BaseException = fn()
    except Exception as exc:
        result = exc
    return time.monotonic() - started, result


def thawed(store: DataStore, timeout: float = 3.0) -> None:
    """Wait until the client holds no server down (its probe found a
    thawed server answering)."""
    wait_for(
        lambda: all(h.state != "down" for h in store.health().values()),
        timeout,
        what="no server to be marked down",
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll until ``predicate()`` holds; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


def run_cli(
    cluster: LocalCluster, store: DataStore, *args: str, stdin: str | None = None
) -> Result:
    """A ``schemaless`` command on the local cluster (it opens with the catalog)."""
    env = {
        "SCHEMALESS_LOCAL_DIR": str(cluster.base_dir),
        "SCHEMALESS_PREFIX": store.cluster.topology.prefix,
        "SCHEMALESS_URL": None,
        "SCHEMALESS_USER": None,
        "SCHEMALESS_PASSWORD": None,
        "SCHEMALESS_OPTION_FILE": None,
    }
    return CliRunner(env=env).invoke(cli, list(args), input=stdin, catch_exceptions=False)
