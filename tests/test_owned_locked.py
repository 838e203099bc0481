"""A ``locked`` batch (many rows of known shards, as the Cleaner's upserts and a
restore write them): its check reads those shards' ``owned`` rows ``LOCK IN SHARE
MODE`` before any write and holds them to its ``COMMIT``, and the triggers skip their
own lookup for those shards' rows only, in that batch only."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from schemaless import DataStore, Index, TableMissing
from schemaless.names import quote
from schemaless.owned import LOCKED, UNCHECKED, admin, locked

BY_N = Index("by_n", {"n": "int"})
_SLEEPING = "SELECT 1 FROM information_schema.PROCESSLIST WHERE `INFO` = 'DO SLEEP(1)'"


def _setup(make_store: Any) -> tuple[DataStore, Any, str, int, int]:
    """A datastore; server 0, its data database, two of its shards."""
    store = make_store([BY_N])
    topo = store.cluster.topology
    db = str(topo.owned_db)
    s, t = topo.placed[0][:2]
    return store, store.cluster.all_servers(topo)[0], db, s, t


def _insert(db: str, shard: int, n: int) -> str:
    return f"INSERT INTO {quote(db, BY_N.table)} VALUES ({shard}, {n}, LPAD({shard}, 16, '0'), 1)"


def _rows(server: Any, db: str, n: int) -> int:
    sql = f"SELECT COUNT(*) FROM {quote(db, BY_N.table)} WHERE `p_n` = {n}"
    return int(server.run(admin([sql]))[0][0][0])


def _fence(server: Any, db: str, shard: int) -> None:
    server.run(admin([f"{UNCHECKED}DELETE FROM {quote(db, 'owned')} WHERE `shard` = {shard}"]))


def test_a_locked_batch_of_a_shard_not_owned_writes_nothing(make_store: Any) -> None:
    _, server, db, s, t = _setup(make_store)
    _fence(server, db, s)
    with pytest.raises(TableMissing):
        server.run(locked([_insert(db, s, 1), _insert(db, t, 1)], db, [s, t]))
    assert _rows(server, db, 1) == 0
    # a row of a shard the batch did not name goes through its trigger as ever
    with pytest.raises(TableMissing):
        server.run(locked([_insert(db, t, 2), _insert(db, s, 2)], db, [t]))
    assert _rows(server, db, 2) == 0
    assert server.run("SELECT @schemaless_locked")[0] == ((None,),)  # never left set


def test_a_fence_waits_for_a_locked_batch_and_fails_the_next(make_store: Any) -> None:
    _, server, db, s, _ = _setup(make_store)
    batch = locked(["DO SLEEP(1)", _insert(db, s, 3)], db, [s])
    done: list[bool] = []

    def write() -> None:
        server.run(batch)
        done.append(True)  # not reached if the batch failed

    writer = threading.Thread(target=write)
    writer.start()
    while not server.run(admin([_SLEEPING]))[0]:  # then it holds the owned row's lock
        time.sleep(0.01)
    started = time.monotonic()
    _fence(server, db, s)
    waited = time.monotonic() - started
    writer.join()
    assert done == [True] and waited >= 0.5  # the fence waited for the batch's commit
    assert _rows(server, db, 3) == 1
    with pytest.raises(TableMissing):
        server.run(locked([_insert(db, s, 4)], db, [s]))
    assert _rows(server, db, 4) == 0
    assert f"SET {LOCKED} = NULL" in batch
