"""Shared fixtures: a real local MariaDB cluster for the whole test session."""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import MySQLdb
import pytest

from schemaless import DataStore, Index, failpoints
from schemaless.cleaner.verify import diff_indexes
from schemaless.dsn import Address
from schemaless.local import LocalCluster
from schemaless.names import quote
from schemaless.owned import admin, data_db
from schemaless.schema import canary_db, shard_db

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """Two running servers (not durable: faster), shared by the sessions that run at
    once (``make test``'s pytest-xdist workers, a second ``pytest``).

    Base dir: ``$SCHEMALESS_TEST_DIR`` or ``<repo>/.pytest-cluster``.  A cluster that
    was already running is left running; one a session started (marked by
    ``.started``) is stopped by the last session to end (``.users``: the live ones).
    """
    base = Path(os.environ.get("SCHEMALESS_TEST_DIR") or REPO / ".pytest-cluster")
    base.mkdir(parents=True, exist_ok=True)
    started = base / ".started"
    with _cluster_lock(base):
        cluster = LocalCluster(base, servers=2, durable=False)
        already = {s.index for s in cluster.servers if s.running()}
        cluster.up()  # a fresh directory has no servers before
        if any(s.index not in already for s in cluster.servers):
            started.touch()
        _users(base, add=os.getpid())
    yield cluster
    with _cluster_lock(base):
        if not _users(base, remove=os.getpid()) and started.exists():
            cluster.down()
            started.unlink()


@contextlib.contextmanager
def _cluster_lock(base: Path) -> Iterator[None]:
    """One session at a time starts, joins or leaves the test cluster."""
    with open(base / ".lock-sessions", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _users(base: Path, add: int | None = None, remove: int | None = None) -> set[int]:
    """The live test sessions (pids) using the cluster, after adding or removing one
    (a session killed before it left is dropped when it is found dead)."""
    path = base / ".users"
    pids = {int(p) for p in path.read_text().split()} if path.exists() else set()
    pids = {p for p in pids if _alive(p)} | ({add} if add else set())
    pids.discard(remove or 0)
    path.write_text(" ".join(map(str, sorted(pids))))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(autouse=True)
def no_failpoints() -> Iterator[None]:
    """No failpoint outlives its test."""
    yield
    failpoints.clear()


class _Dropper:
    """Drops finished tests' databases on a thread of its own, so the next test need
    not wait for them (raw connections: no failpoint of a later test reaches it)."""

    def __init__(self, option_file: Path) -> None:
        self.option_file = option_file
        self.queue: queue.Queue[tuple[Address, list[str]] | None] = queue.Queue()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="dropper", daemon=True)
        self.thread.start()

    def drop(self, store: DataStore) -> None:
        """Close ``store``; its databases are dropped soon after."""
        for address, dbs in _databases_by_server(store):
            self.queue.put((address, dbs))
        store.close()

    def close(self) -> None:
        """Wait until everything queued is dropped; raise the first error met."""
        self.queue.put(None)
        self.thread.join()
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            address, dbs = item
            try:
                conn = MySQLdb.connect(
                    host=address.host,
                    port=address.port,
                    read_default_file=str(self.option_file),
                    read_default_group="client",
                )
                try:
                    for db in dbs:
                        _drop(conn, db)
                finally:
                    conn.close()
            except BaseException as exc:
                self.errors.append(exc)


def _drop(conn: Any, db: str, attempts: int = 10) -> None:
    """``DROP DATABASE``, again while the server says its directory is not empty
    (error 1010: a statement of the finished test, such as an ``ALTER TABLE`` whose
    client went away, may still be writing its temporary files there).  A file that
    stays, such as the ``.TRG-`` of a ``CREATE TRIGGER`` cut short by a killed
    process, is the server's own leftover: the database stays in the scratch cluster."""
    for attempt in range(attempts):
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS {quote(db)}")
            return
        except MySQLdb.OperationalError as exc:
            if exc.args[0] != 1010:
                raise
            if attempt == attempts - 1:
                print(f"left database {db} in the test cluster: {exc}", file=sys.stderr)
                return
            time.sleep(0.5)


@pytest.fixture(scope="session")
def dropper(local_cluster: LocalCluster) -> Iterator[_Dropper]:
    """The session's background dropper of test datastores (torn down before the
    cluster, waiting for every drop)."""
    dropper = _Dropper(local_cluster.option_file)
    yield dropper
    dropper.close()


@pytest.fixture
def make_store(
    local_cluster: LocalCluster, dropper: _Dropper
) -> Iterator[Callable[..., DataStore]]:
    """A factory of datastores, each with its own prefix (8 logical shards, a short
    catalog refresh interval); their databases are dropped afterwards (in the
    background: ``dropper``)."""
    stores: list[DataStore] = []

    def make(indexes: Sequence[Index] = (), shards: int = 8, **kwargs: Any) -> DataStore:
        kwargs.setdefault("refresh_interval", 0.2)
        kwargs.setdefault("option_file", str(local_cluster.option_file))
        store = DataStore(
            local_cluster.addresses,
            indexes,
            prefix="t_" + uuid.uuid4().hex[:12],
            shards=shards,
            **kwargs,
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        dropper.drop(store)


def same_store(
    local_cluster: LocalCluster, store: DataStore, create: bool = False, **options: Any
) -> DataStore:
    """Another client of the same datastore (its own pools and catalog refreshes;
    ``options``: the constructor's, a ``tracer`` say)."""
    return DataStore(
        local_cluster.addresses,
        option_file=str(local_cluster.option_file),
        prefix=store.cluster.topology.prefix,
        create=create,
        **options,
    )


def assert_clean(store: DataStore, *names: str) -> None:
    """Every index (or those named) holds exactly the rows its entities produce."""
    diffs = diff_indexes(store, names or None)
    assert {n: d.summary() for n, d in diffs.items() if not d.clean} == {}


def _databases_by_server(store: DataStore) -> list[tuple[Address, list[str]]]:
    """Every database of a datastore, by the address of the server holding it."""
    topo = store.cluster.refresh()
    out = []
    for sid, server in store.cluster.all_servers(topo).items():
        dbs = [shard_db(topo.prefix, s) for s in topo.shards_of(sid)] + [canary_db(topo.prefix)]
        dbs.append(data_db(topo.prefix))
        if sid == 0:
            dbs.append(f"{topo.prefix}_catalog")
        out.append((server.address, dbs))
    return out


def drop_datastore(store: DataStore) -> None:
    """Drop every database of a datastore and close it."""
    for address, dbs in _databases_by_server(store):
        server = store.cluster.server(address)
        server.run(admin([f"DROP DATABASE IF EXISTS {quote(db)}" for db in dbs]))
    store.close()


def shard_select(store: DataStore, shard: int, table: str, columns: str, where: str = "") -> str:
    """A raw ``SELECT`` of one logical shard's rows of a table, in either layout (the
    owned layout's data database holds every shard of the server: filtered here),
    marked administrative so a test's own read is not refused for lacking the check."""
    topo = store.cluster.topology
    conds = [f"`shard` = {int(shard)}"] if topo.owned_db else []
    conds += [where] if where else []
    tail = f" WHERE {' AND '.join(conds)}" if conds else ""
    return admin([f"SELECT {columns} FROM {quote(topo.dbs[shard], table)}{tail}"])


def shard_rows(
    store: DataStore, shard: int, table: str, columns: str, where: str = "", params: Any = ()
) -> list[tuple[Any, ...]]:
    """The rows ``shard_select`` reads, from the shard's server."""
    server = store.cluster.server_of_shard(store.cluster.topology, shard)
    return list(server.run(shard_select(store, shard, table, columns, where), params)[0])


def wait_until(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    """``check()`` once it is truthy, polled every 50 ms; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting")
