"""The owned layout's fence with the library's own writes and reads (issue 39, step 3):
a put stopped between step 2's statements holds its shard's ``owned`` row and delays
the fence (``DELETE FROM owned WHERE shard = s``, as a move sends it) until it commits,
and delays no other shard's writes; a writer process frozen meanwhile holds it no
longer than its batch runs in the server; after the fence every call on that shard
with the old map fails with ``TableMissing`` from the server, never returns what was
left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import shard_rows
from faults.helpers import ids_of_shard

from bench.env import Servers
from schemaless import DataStore, Index, TableMissing
from schemaless.hashing import shard_of
from schemaless.local import LocalCluster
from schemaless.names import quote
from schemaless.owned import UNCHECKED, admin
from schemaless.tables import by_id_sql

BY_N = Index("by_n", {"n": "int"})
WAIT = 0.3  # seconds a blocked statement is watched before it is judged blocked
UNDELAYED = 2.0  # seconds within which a write that waits for nothing returns, loaded

#: A writer process: put_many of two entities (ids in hex) with ``n`` and ``n + 1``,
#: then its versions on stdout.
WRITER = """
import os, sys
from schemaless import DataStore
addrs, option_file, prefix, first, second, n = sys.argv[1:]
ds = DataStore(addrs.split(","), prefix=prefix, option_file=option_file, create=False)
keys = [bytes.fromhex(first), bytes.fromhex(second)]
print(ds.put_many([{"id": k, "n": int(n) + i} for i, k in enumerate(keys)]), flush=True)
os._exit(0)
"""


def _ids(store: DataStore, shard: int, n: int) -> list[bytes]:
    """``n`` new ids of logical shard ``shard``, in the order step 2 writes them."""
    return sorted(ids_of_shard(store, shard, n))


def _value(store: DataStore, avoid: int, start: int = 0) -> int:
    """An ``n`` whose index row is not on logical shard ``avoid``."""
    n_shards = store.cluster.topology.n_shards
    return next(
        n for n in range(start, start + 100) if shard_of(BY_N.shard_key((n,)), n_shards) != avoid
    )


def _second_locked(store: DataStore, locker: Any, shard: int) -> tuple[bytes, bytes, int, Any]:
    """Two new ids of ``shard`` and an ``n`` for them; the second stored, its row locked
    by ``locker``'s open transaction (its cursor returned: ``ROLLBACK`` lets it go), so
    step 2 of a write of both stops at the second."""
    first, second = _ids(store, shard, 2)
    n = _value(store, shard)
    store.put({"id": second, "n": n})
    cur = locker.cursor()
    cur.execute("START TRANSACTION")
    db = quote(store.cluster.topology.dbs[shard], "entities")
    cur.execute(f"SELECT `id` FROM {db} WHERE `id` = %s FOR UPDATE", (second,))
    return first, second, n, cur


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a thread; its result (or error) lands in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _trx(store: DataStore, sid: int) -> list[Any]:
    """The server's open transactions: state and what each runs."""
    server = store.cluster.all_servers(store.cluster.topology)[sid]
    sql = "SELECT trx_state, trx_query FROM information_schema.INNODB_TRX"
    return list(server.run(sql)[0])


def _lock_waits(store: DataStore, sid: int) -> int:
    """This datastore's transactions waiting for a lock (another test's may run beside)."""
    db = str(store.cluster.topology.owned_db)
    return sum(1 for state, q in _trx(store, sid) if state == "LOCK WAIT" and db in (q or ""))


def _wait_lock_waits(store: DataStore, n: int, timeout: float = 30.0) -> None:
    """Wait until ``n`` transactions of server 0 wait for a lock, polling every 0.15 s
    (InnoDB refreshes INNODB_TRX only when last read more than 0.1 s before; a loaded
    machine can take seconds); a timeout shows the server's transactions."""
    deadline = time.monotonic() + timeout
    while _lock_waits(store, 0) != n:
        if time.monotonic() > deadline:
            pytest.fail(f"not {n} lock waits; server 0's transactions: {_trx(store, 0)}")
        time.sleep(0.15)


@pytest.fixture
def store(make_store: Callable[..., DataStore]) -> DataStore:
    return make_store([BY_N])


@pytest.fixture
def locker(store: DataStore, local_cluster: LocalCluster) -> Iterator[Any]:
    """A driver connection of its own to server 0 (transactions left open on it)."""
    addr = str(store.cluster.topology.servers[0])
    conn = Servers((addr,), str(local_cluster.option_file)).connect(0)
    yield conn
    conn.close()


def _fence(store: DataStore, shard: int) -> None:
    """A move's fence of ``shard`` on its server, as an administrative batch."""
    topo = store.cluster.topology
    assert topo.owned_db is not None
    sql = f"{UNCHECKED}DELETE FROM {quote(topo.owned_db, 'owned')} WHERE `shard` = {int(shard)}"
    store.cluster.server_of_shard(topo, shard).run(admin([sql]), commits=True)


def test_a_put_inside_step_2_delays_the_fence_and_no_other_shard(
    store: DataStore, locker: Any
) -> None:
    """put_many of two entities of shard A: the first is written (its guard key holds
    A's ``owned`` row shared), the second waits on a row lock the test holds. The
    fence of A waits for that put; a put on shard B of the same server does not; once
    the lock goes, the put commits before the fence, and its entities stay."""
    topo = store.cluster.topology
    a, b = topo.shards_of(0)[:2]
    first, second, n, cur = _second_locked(store, locker, a)
    writes = [{"id": first, "n": n}, {"id": second, "n": n + 1}]
    writer, wrote = _in_thread(lambda: store.put_many(writes))
    _wait_lock_waits(store, 1)  # step 2 stopped at the second entity
    fencer, fenced = _in_thread(lambda: _fence(store, a))
    _wait_lock_waits(store, 2)  # the fence waits too
    started = time.monotonic()
    (other,) = _ids(store, b, 1)
    store.put({"id": other, "n": _value(store, a, n + 2)})
    # not delayed: had it waited for the fence, it would wait until the lock is let go
    assert time.monotonic() - started < UNDELAYED
    time.sleep(WAIT)
    assert writer.is_alive() and fencer.is_alive()
    cur.execute("ROLLBACK")
    writer.join(10)
    fencer.join(10)
    assert "error" not in wrote and "error" not in fenced, (wrote, fenced)
    assert len(wrote["result"]) == 2  # both written: the key let them in, the fence after
    rows = shard_rows(store, a, "entities", "`id`, `version`", "`body` IS NOT NULL")
    assert {bytes(r[0]): int(r[1]) for r in rows} == dict(
        zip([first, second], wrote["result"], strict=True)
    )


def test_after_the_fence_every_call_on_the_shard_fails(store: DataStore) -> None:
    """After A's fence (the catalog unchanged, no move recorded), put, get, get_many,
    queries, delete and a raw read batch of A fail with TableMissing from the server's
    check or trigger; nothing is written, and the rows left behind are never returned.
    Shard B, on the same server, is served as before."""
    topo = store.cluster.topology
    a, b = topo.shards_of(0)[:2]
    (key,) = _ids(store, a, 1)
    (other,) = _ids(store, b, 1)
    (new,) = _ids(store, a, 1)
    n_a = next(n for n in range(100) if shard_of(BY_N.shard_key((n,)), topo.n_shards) == a)
    store.put({"id": key, "n": n_a})
    n_b = _value(store, a, 1000)
    store.put({"id": other, "n": n_b})
    _fence(store, a)
    version = store.cluster.refresh().map_version
    before = shard_rows(store, a, "entities", "`id`, `version`, `body`")
    calls: dict[str, Callable[[], object]] = {
        "get": lambda: store.get(key),
        "get_many": lambda: store.get_many([key, other]),
        "put": lambda: store.put({"id": key, "n": 1}),
        "put new": lambda: store.put({"id": new, "n": 2}),
        "update": lambda: store.update(key, lambda e: {**(e or {}), "n": 3}),
        "delete": lambda: store.delete(key),
        "query on A": lambda: store.query(BY_N, n=n_a),
        "scatter query": lambda: store.query(BY_N, n__gte=0),
    }
    for name, call in calls.items():
        with pytest.raises(TableMissing):
            call()
            pytest.fail(f"{name} returned")
    server = store.cluster.server_of_shard(topo, a)
    with pytest.raises(TableMissing):
        server.run(*by_id_sql(topo, {a: [key]}, "`id`, `body`", counted=True))
    assert server.run(*by_id_sql(topo, {a: [key]}, "`id`, `body`"))[0] == ()  # not the map's
    assert shard_rows(store, a, "entities", "`id`, `version`, `body`") == before
    assert store.cluster.refresh().map_version == version  # the catalog never changed
    assert store.get(other) == {"id": other, "n": n_b}
    assert [e.id for e in store.query(BY_N, n=n_b)] == [other]


def test_a_stopped_writer_holds_the_fence_no_longer_than_its_batch_runs(
    store: DataStore, locker: Any, local_cluster: LocalCluster
) -> None:
    """A writer process frozen (SIGSTOP) while its step 2 waits inside the server: the
    batch goes on without it (one round trip: the server never waits for the client
    inside a transaction), commits once the test lets its row lock go, and the fence
    follows at once; woken, the writer is told its versions, which are what is stored."""
    topo = store.cluster.topology
    a = topo.shards_of(0)[0]
    first, second, n, cur = _second_locked(store, locker, a)
    args = [",".join(local_cluster.addresses), str(local_cluster.option_file), topo.prefix]
    args += [first.hex(), second.hex(), str(n)]
    proc = subprocess.Popen([sys.executable, "-c", WRITER, *args], stdout=subprocess.PIPE)
    try:
        _wait_lock_waits(store, 1)
        os.kill(proc.pid, signal.SIGSTOP)
        fencer, fenced = _in_thread(lambda: _fence(store, a))
        _wait_lock_waits(store, 2)
        cur.execute("ROLLBACK")
        fencer.join(UNDELAYED)
        assert not fencer.is_alive() and "error" not in fenced, fenced
        rows = shard_rows(store, a, "entities", "`id`, `version`", "`body` IS NOT NULL")
    finally:
        os.kill(proc.pid, signal.SIGCONT)  # (on a failure, it ends when the lock goes)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    versions = [int(v) for v in out.decode().strip(" []\n").split(",")]
    assert {bytes(r[0]): int(r[1]) for r in rows} == dict(
        zip([first, second], versions, strict=True)
    )
