"""The owned layout's index tables are guarded by the key alone: ``by_shard`` names each
row's owner and version, so every write that changes an index row re-adds its entry
there and InnoDB checks the key, holding the shard's ``owned`` row to the commit; a
write that changes nothing meets no guard and changes nothing (docs/architecture.md,
"The key guards changed index rows too").  On real servers, the statements the library
sends (``schemaless.writes``)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from schemaless import DataStore, Index, TableMissing, owned
from schemaless.connection import Server
from schemaless.hashing import shard_of
from schemaless.keys import key_encode
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import UNCHECKED, admin
from schemaless.writes import upsert_sql

BY_V = Index("by_v", {"v": "int"})
BY_NAME = Index("by_name", {"name": "str(40)"}, unique=True)
OWNER, OTHER = b"\x01" * 16, b"\x02" * 16
_SLEEPING = "SELECT 1 FROM information_schema.PROCESSLIST WHERE `INFO` = 'DO SLEEP(1)'"


def _setup(make_store: Callable[..., DataStore]) -> tuple[Server, str]:
    """Shard 0's server and the data database of a new owned datastore."""
    store = make_store([BY_V, BY_NAME], shards=2)
    topo = store.cluster.topology
    assert topo.owned_db is not None
    return store.cluster.server_of_shard(topo, 0), topo.owned_db


def _upsert(server: Server, db: str, index: Index, row: list[Any]) -> list[int]:
    counts: list[int] = []
    server.run(admin([upsert_sql(db, index, 1, shard=True)]), row, counts=counts)
    return counts


def _stored(server: Server, db: str, index: Index) -> list[tuple[Any, ...]]:
    sql = f"SELECT `shard`, `entity_id`, `entity_version` FROM {quote(db, index.table)}"
    return sorted(tuple(r) for r in server.run(admin([sql]))[0])


def _fence(server: Server, db: str, shard: int) -> None:
    owned = quote(db, "owned")
    server.run(admin([f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {shard}"]))


@pytest.mark.parametrize("index", [BY_V, BY_NAME], ids=["plain", "unique"])
def test_after_the_fence_a_change_of_an_index_row_is_refused_a_no_op_changes_nothing(
    make_store: Callable[..., DataStore], index: Index
) -> None:
    server, db = _setup(make_store)
    value = 5 if index is BY_V else "ada"
    assert _upsert(server, db, index, [0, value, OWNER, 10]) == [1]
    _fence(server, db, 0)
    with pytest.raises(TableMissing):  # a raised version re-adds the by_shard entry
        _upsert(server, db, index, [0, value, OWNER, 11])
    with pytest.raises(TableMissing):  # a new row
        _upsert(server, db, index, [0, 6 if index is BY_V else "bob", OWNER, 11])
    assert _upsert(server, db, index, [0, value, OWNER, 9]) == [0]  # GREATEST keeps 10
    if index is BY_NAME:  # another owner's claim leaves the row as it is; a takeover fails
        assert _upsert(server, db, index, [0, value, OTHER, 12]) == [0]
        takeover = (
            f"UPDATE {quote(db, index.table)} SET `entity_id` = %s, `entity_version` = %s"
            " WHERE `p_name` = %s AND `entity_id` = %s AND `entity_version` = %s"
        )
        with pytest.raises(TableMissing):
            server.run(admin([takeover]), [OTHER, 12, value, OWNER, 10])
    assert _stored(server, db, index) == [(0, OWNER, 10)]


def test_a_fence_waits_for_a_writer_that_changed_an_index_row(
    make_store: Callable[..., DataStore],
) -> None:
    """The key's check holds the ``owned`` row's shared lock to the writer's commit: a
    fence (which deletes the row) waits, and the write stays."""
    server, db = _setup(make_store)
    assert _upsert(server, db, BY_V, [0, 5, OWNER, 10]) == [1]
    batch = admin(
        ["START TRANSACTION", upsert_sql(db, BY_V, 1, shard=True), "DO SLEEP(1)", "COMMIT"]
    )
    done: list[bool] = []

    def write() -> None:
        server.run(batch, [0, 5, OWNER, 11], commits=True)
        done.append(True)

    writer = threading.Thread(target=write)
    writer.start()
    while not server.run(admin([_SLEEPING]))[0]:
        time.sleep(0.01)
    started = time.monotonic()
    _fence(server, db, 0)
    waited = time.monotonic() - started
    writer.join()
    assert done == [True] and waited >= 0.5
    assert _stored(server, db, BY_V) == [(0, OWNER, 11)]
    with pytest.raises(TableMissing):
        _upsert(server, db, BY_V, [0, 5, OWNER, 12])


def test_index_tables_of_an_earlier_build_keep_their_trigger_and_work(
    make_store: Callable[..., DataStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A datastore whose index tables an earlier build made (``by_shard (shard)`` and
    the update trigger) is written, moved and fenced by this build as before: the
    statements are the same, its trigger guards the rows the key no longer meets."""

    def earlier(db: str, index: Index, *, entity_key: bool = True) -> list[str]:
        made = index.create_table_sql(db, entity_key=entity_key, shard=True)
        made = re.sub(r"KEY `by_shard` \([^)]*\)", "KEY `by_shard` (`shard`)", made)
        return [made, *owned.guard_sql(db, index.table)]

    monkeypatch.setattr(owned, "index_table_sql", earlier)
    store = make_store([BY_V], shards=4)
    monkeypatch.undo()
    topo = store.cluster.topology
    db, shard = str(topo.owned_db), shard_of(key_encode(5), topo.n_shards)
    server = store.cluster.server_of_shard(topo, shard)
    made = server.run(admin([f"SHOW CREATE TABLE {quote(db, BY_V.table)}"]))[0][0][1]
    assert "KEY `by_shard` (`shard`)," in made
    entities = [{"v": 5, "n": i} for i in range(20)]
    store.put_many(entities)
    # present index rows, upserted through their trigger
    versions = [store.put({**e, "n": e["n"] + 100}) for e in entities[:10]]
    ShardMover(store).move(shard, 1 - topo.shard_servers[shard])
    found = store.query(BY_V, where={"v": 5}, limit=50)
    assert sorted(e["n"] for e in found) == sorted([*range(100, 110), *range(10, 20)])
    _fence(server, db, shard)  # the old copy's server: a changed row is refused
    assert (shard, entities[0]["id"], versions[0]) in _stored(server, db, BY_V)
    with pytest.raises(TableMissing):  # its row present: the trigger, not the key
        _upsert(server, db, BY_V, [shard, 5, entities[0]["id"], 2**62])
