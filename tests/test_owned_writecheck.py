"""A write that may match no row (a delete, a compare-and-set) in the owned layout: sent
``tentative`` first (no check: a write that applies proves its shard owned through the
triggers); when it did not apply, a compare-and-set is sent again ``checked_first`` (the
``owned`` rows locked before the write), whose answer alone is taken, and a blind
delete's answer is the stored state, read checked.  On real servers, with the shard fenced
before the write, between its two batches, during a batch (the fence waits) and after
it: never a silent "not found" or "conflict" from a server that does not own the shard,
never a lost acknowledged write (docs/architecture.md, "The check")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from schemaless import ConflictError, DataStore, Index, TableMissing, failpoints
from schemaless.batch import Batch
from schemaless.connection import Server
from schemaless.names import quote
from schemaless.owned import UNCHECKED, admin, checked_first, tentative
from schemaless.writes import EntityWrite, WriteMode, entity_batch_sql, write_position

BY_V = Index("by_v", {"v": "int"})
expect = WriteMode.expect
_SLEEPING = "SELECT 1 FROM information_schema.PROCESSLIST WHERE `INFO` = 'DO SLEEP(1)'"


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    yield
    failpoints.clear()


def _id_on(store: DataStore, shard: int, skip: int = 0) -> bytes:
    keys = (k.to_bytes(16, "big") for k in range(100_000))
    return [key for key in keys if store.cluster.shard_of_id(key) == shard][skip]


def _server(store: DataStore) -> Server:
    return store.cluster.server_of_shard(store.cluster.topology, 0)


def _fence(store: DataStore, shard: int = 0) -> None:
    """A move's fence, by hand: the shard's ``owned`` row deleted on its server."""
    owned = quote(store.cluster.topology.owned_db or "", "owned")
    _server(store).run(admin([f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {shard}"]))


def _stored(store: DataStore, key: bytes) -> tuple[int, bool] | None:
    """The entity row as the server holds it, read around the check: (version, live)."""
    table = quote(store.cluster.topology.owned_db or "", "entities")
    sql = f"SELECT `version`, `body` IS NOT NULL FROM {table} WHERE `id` = %s"
    rows = _server(store).run(admin([sql]), [key])[0]
    return (int(rows[0][0]), bool(rows[0][1])) if rows else None


def _counting(name: str) -> list[int]:
    """Count the hits of failpoint ``name``."""
    hits: list[int] = []
    failpoints.set(name, lambda: hits.append(1))
    return hits


@pytest.mark.parametrize("indexes", [(), (BY_V,)])
@pytest.mark.parametrize("changes", [False, True])
def test_an_owned_shards_unapplied_write_is_checked_then_answered(
    make_store: Callable[..., DataStore], indexes: tuple[Index, ...], changes: bool
) -> None:
    store = make_store(list(indexes), changes=changes)
    key, absent = _id_on(store, 0), _id_on(store, 0, 1)
    version = store.put({"id": key, "v": 1})
    unapplied = _counting("write.before_checked")
    assert store.put({"id": key, "v": 2}, expect_version=version) > version  # tentative
    assert store.delete(key) is True and unapplied == []  # applied: nothing more
    assert store.delete(absent) is False and len(unapplied) == 1  # its state read
    with pytest.raises(ConflictError) as conflict:  # sent again checked
        store.put({"id": key, "v": 3}, expect_version=version)
    assert conflict.value.current_version is None and len(unapplied) == 2
    other = store.put({"id": absent, "v": 4})
    with pytest.raises(ConflictError) as stale:
        store.delete(absent, expect_version=other - 1)
    assert stale.value.current_version == other and len(unapplied) == 3
    assert store.get(absent) == {"id": absent, "v": 4}


def test_only_a_compare_and_set_is_sent_again_checked(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store([BY_V])
    key = _id_on(store, 0)
    version = store.put({"id": key, "v": 1})
    sent: list[str] = []
    failpoints.set("write.before_checked", lambda: sent.clear())
    batch = Batch.send

    def spy(self: Batch) -> Any:
        sent.append(self.sql)
        return batch(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Batch, "send", spy)
        with pytest.raises(ConflictError):
            store.delete(key, expect_version=version + 1)
        checked = [sql for sql in sent if "`entities` SET" in sql]
        assert len(checked) == 1 and checked[0].startswith("START TRANSACTION;\n")
        assert "LOCK IN SHARE MODE) < 1 THEN SIGNAL" in checked[0].split(";\n")[1]
        sent.clear()
        assert store.delete(_id_on(store, 0, 1)) is False
        assert not [sql for sql in sent if "`entities` SET" in sql]  # the state read only


@pytest.mark.parametrize("write", ["delete", "delete absent", "cas", "cas stale", "delete cas"])
def test_a_fenced_shard_is_never_answered_not_found_or_conflict(
    make_store: Callable[..., DataStore], write: str
) -> None:
    store = make_store([BY_V])
    key, absent = _id_on(store, 0), _id_on(store, 0, 1)
    version = store.put({"id": key, "v": 1})
    calls: dict[str, Callable[[], object]] = {
        "delete": lambda: store.delete(key),
        "delete absent": lambda: store.delete(absent),
        "cas": lambda: store.put({"id": key, "v": 2}, expect_version=version),
        "cas stale": lambda: store.put({"id": key, "v": 2}, expect_version=version + 1),
        "delete cas": lambda: store.delete(key, expect_version=version + 1),
    }
    _fence(store)
    with pytest.raises(TableMissing):
        calls[write]()
    assert _stored(store, key) == (version, True)  # nothing written
    assert _stored(store, absent) is None


@pytest.mark.parametrize("write", ["delete absent", "cas stale"])
def test_a_fence_between_the_tentative_and_the_checked_batch_is_seen(
    make_store: Callable[..., DataStore], write: str
) -> None:
    """The tentative batch found nothing to change on a shard still owned; the fence
    comes before the checked batch or the state's read, which fails: never the first
    batch's silence."""
    store = make_store()
    key, absent = _id_on(store, 0), _id_on(store, 0, 1)
    version = store.put({"id": key, "v": 1})
    failpoints.set("write.before_checked", lambda: _fence(store))
    with pytest.raises(TableMissing):
        if write == "delete absent":
            store.delete(absent)
        else:
            store.put({"id": key, "v": 2}, expect_version=version + 1)
    assert _stored(store, key) == (version, True)


def _held(store: DataStore, batch: str, params: list[Any]) -> tuple[float, list[bool]]:
    """Send ``batch`` (which sleeps a second while it holds its locks) in a thread,
    fence shard 0 while it sleeps: how long the fence waited, and whether the batch
    was acknowledged."""
    server, done = _server(store), []

    def write() -> None:
        server.run(batch, params, commits=True)
        done.append(True)  # not reached if the batch failed

    writer = threading.Thread(target=write)
    writer.start()
    while not server.run(admin([_SLEEPING]))[0]:
        time.sleep(0.01)
    started = time.monotonic()
    _fence(store)
    waited = time.monotonic() - started
    writer.join()
    return waited, done


@pytest.mark.parametrize("build", ["tentative", "checked_first"])
def test_a_fence_waits_for_a_write_that_holds_its_shard(
    make_store: Callable[..., DataStore], build: str
) -> None:
    """A tentative write that applied holds the ``owned`` row through its guard (the
    key's check, on the index of ``updated``), a checked one from its check, to the
    ``COMMIT``: the fence waits, the write is acknowledged and kept; the same write
    after the fence fails, nothing written."""
    store = make_store()
    key = _id_on(store, 0)
    version = store.put({"id": key, "v": 1})
    db = store.cluster.topology.owned_db
    update = (
        f"UPDATE {quote(db or '', 'entities')} SET `body` = NULL, `version` = %s,"
        " `updated` = `updated` + 1 WHERE `id` = %s AND `version` = %s"
    )

    def batch(stmts: list[str]) -> str:
        return tentative(stmts, db) if build == "tentative" else checked_first(stmts, db, [0])

    stmts = [update, "DO SLEEP(1)"] if build == "tentative" else ["DO SLEEP(1)", update]
    waited, done = _held(store, batch(stmts), [version + 1, key, version])
    assert done == [True] and waited >= 0.5
    assert _stored(store, key) == (version + 1, False)  # acknowledged, kept
    with pytest.raises(TableMissing):
        _server(store).run(batch([update]), [version + 2, key, version + 1], commits=True)
    assert _stored(store, key) == (version + 1, False)


@pytest.mark.parametrize("tentative_ok", [False, True])
@pytest.mark.parametrize("changes", [False, True])
def test_either_form_reports_each_writes_affected_rows_where_the_writer_reads_them(
    make_store: Callable[..., DataStore], tentative_ok: bool, changes: bool
) -> None:
    """The positions of the writes' affected-row counts (``write_position``) in both
    forms, on a real server: a compare-and-set that applies reads 1 there, one that
    does not 0 (``checked_first`` puts its check before them)."""
    store = make_store(changes=changes)
    topo = store.cluster.topology
    keys = sorted([_id_on(store, 0), _id_on(store, 0, 1)])
    versions = [store.put({"id": key, "v": 1}) for key in keys]
    body = store.codec.encode({"v": 2})
    writes = [
        EntityWrite(topo.dbs[0], 0, keys[0], versions[0] + 1, 1, body, expect(versions[0]), True),
        EntityWrite(
            topo.dbs[0], 0, keys[1], versions[1] + 1, 1, None, expect(versions[1] + 5), True
        ),
    ]
    sql, params, first = entity_batch_sql(
        writes, (), topo.dbs, topo.fence, changes, topo.owned_db, tentative_ok
    )
    counts: list[int] = []
    rows = _server(store).run(sql, params, commits=True, counts=counts)
    assert [r[0][0] is not None for r in rows[:2]] == [True, True]  # the old bodies
    assert [counts[write_position(first, n, writes)] for n in range(2)] == [1, 0]
    assert _stored(store, keys[0]) == (versions[0] + 1, True)
    assert _stored(store, keys[1]) == (versions[1], True)
