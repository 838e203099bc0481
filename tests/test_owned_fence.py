"""The owned layout's fence on real servers (issue 39, step 2), with the statements of
bench/ownedsql.py against tables each test creates: a writer holding a shard's
``owned`` row delays the fence (the row's ``DELETE``) until it commits; a guarded write
after the fence writes nothing and says so (0 rows); a read batch across the fence is
detected by its count; and the fence waits for, and blocks, the moved shard only."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import MySQLdb
import pytest

from bench import ownedsql
from bench.env import RawClient, Servers
from bench.ops import BY_USER
from schemaless.local import LocalCluster
from schemaless.writes import BLIND, EntityWrite, IndexRow

HOLD = 0.4  # seconds a transaction stays open while another statement waits for it
Stmt = tuple[str, list[Any]]


@pytest.fixture
def servers(local_cluster: LocalCluster) -> Servers:
    return Servers(tuple(local_cluster.addresses), str(local_cluster.option_file))


@pytest.fixture
def db(servers: Servers) -> Iterator[ownedsql.OwnedDb]:
    """An owned-layout database on server 0 owning shards 1 and 2, each with one
    entity (id ``bytes([s]) * 16``, version 1) and its by_user row."""
    own = _create(servers, ownedsql.OwnedDb("of_" + uuid.uuid4().hex[:10]))
    yield own
    servers.admin(0, f"DROP DATABASE {own.name}")


def _create(servers: Servers, own: ownedsql.OwnedDb) -> ownedsql.OwnedDb:
    servers.admin(0, ";\n".join(own.ddl([BY_USER], [1, 2])))
    for s in (1, 2):
        servers.admin(
            0,
            f"INSERT INTO {own.entities} (`shard`, `id`, `version`, `updated`, `body`)"
            f" VALUES ({s}, %s, 1, 1, 'a');"
            f" INSERT INTO {own.table(BY_USER.table)} VALUES ({s}, %s, {s}, %s, 1)",
            [_id(s), _id(s), _id(s)],
        )
    return own


def _id(shard: int, k: int = 0) -> bytes:
    return bytes([shard, k]) * 8


def _shapes(db: ownedsql.OwnedDb, s: int) -> dict[str, Stmt]:
    """Every kind of guarded write, on shard ``s``'s entity and index row."""
    key, row = _id(s), IndexRow(BY_USER, s, (_id(s), s), _id(s), 9)
    new_row = IndexRow(BY_USER, s, (_id(s), 100 + s), _id(s), 9)
    return {
        "insert": (ownedsql.entity_sql(db, s, "new", False, None), [_id(s, 1), 1, 1, b"n"]),
        "upsert": (ownedsql.entity_sql(db, s, "blind", False, None), [key, 9, 9, b"u"]),
        "update": (ownedsql.entity_sql(db, s, "cas", False, None), [b"c", 9, 9, key, 1]),
        "tombstone": (ownedsql.entity_sql(db, s, "delete", False, None), [9, 9, key, 9]),
        "step 1": ownedsql.upsert_rows_sql(db, [new_row]),
        "step 1, 3 rows": ownedsql.upsert_rows_sql(
            db, [IndexRow(BY_USER, s, (_id(s, k), k), _id(s, k), 9) for k in (1, 2, 3)]
        ),
        "step 3": ownedsql.delete_rows_sql(db, [row]),
    }


SHAPES = ("insert", "upsert", "update", "tombstone", "step 1", "step 1, 3 rows", "step 3")


def _open(servers: Servers) -> Any:
    conn = servers.connect(0)
    conn.query("SET SESSION innodb_lock_wait_timeout = 5")
    return conn


def _exec(conn: Any, sql: str, params: list[Any] | None = None) -> tuple[list[Any], int]:
    """Run one statement; (its rows, its affected rows)."""
    cur = conn.cursor()
    cur.execute(sql, params or None)
    rows, count = list(cur.fetchall() or ()), cur.rowcount
    cur.close()
    return rows, count


def _timed(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a thread; its result and how long it took land in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        t = time.perf_counter()
        out["result"] = fn()
        out["seconds"] = time.perf_counter() - t

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _held(conn: Any, stmt: Stmt) -> int:
    """Begin a transaction and run one guarded write in it (left open); its rows."""
    _exec(conn, "START TRANSACTION")
    sql = stmt[0].removeprefix("START TRANSACTION;\n").removesuffix(";\nCOMMIT")
    return _exec(conn, sql, stmt[1])[1]


def _owned(servers: Servers, db: ownedsql.OwnedDb) -> list[int]:
    return [r[0] for r in servers.admin(0, f"SELECT `shard` FROM {db.owned} ORDER BY 1")]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_writer_holding_the_row_delays_the_fence(
    servers: Servers, db: ownedsql.OwnedDb, shape: str
) -> None:
    """Each write shape takes the shared lock: the fence waits for its commit, and
    the write, committed before the fence, stays."""
    writer, fencer = _open(servers), _open(servers)
    try:
        assert _held(writer, _shapes(db, 1)[shape]) >= 1
        thread, fence = _timed(lambda: _exec(fencer, ownedsql.fence_sql(db, 1))[1])
        time.sleep(HOLD)
        assert thread.is_alive()  # the fence waits for the writer
        checksum = servers.admin(0, f"CHECKSUM TABLE {db.entities}, {db.table(BY_USER.table)}")
        _exec(writer, "COMMIT")
        thread.join()
        assert fence["result"] == 1 and fence["seconds"] >= HOLD
        assert _owned(servers, db) == [2]
        after = servers.admin(0, f"CHECKSUM TABLE {db.entities}, {db.table(BY_USER.table)}")
        assert after != checksum  # the write committed, before the fence
    finally:
        writer.close()
        fencer.close()


def test_the_unlocked_insert_select_would_not_delay_it(
    servers: Servers, db: ownedsql.OwnedDb
) -> None:
    """Why every guarded insert says LOCK IN SHARE MODE: at READ COMMITTED an INSERT
    ... SELECT reads the owned row without a lock, and the fence passes it (the write
    then commits after the fence: lost at the source)."""
    sql, params = _shapes(db, 1)["insert"]
    writer, fencer = _open(servers), _open(servers)
    try:
        assert _held(writer, (sql.replace(" LOCK IN SHARE MODE", ""), params)) == 1
        t = time.perf_counter()
        assert _exec(fencer, ownedsql.fence_sql(db, 1))[1] == 1
        assert time.perf_counter() - t < HOLD
        _exec(writer, "COMMIT")
        assert _owned(servers, db) == [2]  # ... and the entity was written behind it
        found = servers.admin(0, f"SELECT 1 FROM {db.entities} WHERE `id` = %s", [_id(1, 1)])
        assert found == [(1,)]
    finally:
        writer.close()
        fencer.close()


def test_a_guarded_write_after_the_fence_writes_nothing(
    servers: Servers, db: ownedsql.OwnedDb
) -> None:
    """After the fence every shape affects 0 rows and changes nothing on the moved
    shard, while the same shapes on the shard still owned apply; a whole step 2 batch
    reports its write unapplied (the client reads the map again)."""
    tables = f"{db.entities}, {db.table(BY_USER.table)}"
    servers.admin(0, ownedsql.fence_sql(db, 1))
    before = servers.admin(0, f"CHECKSUM TABLE {tables}")
    conn = _open(servers)
    try:
        for shard, applies in ((1, False), (2, True)):
            for shape in SHAPES:
                affected = _held(conn, _shapes(db, shard)[shape])
                _exec(conn, "ROLLBACK")
                assert (affected > 0) is applies, (shard, shape)
        assert servers.admin(0, f"CHECKSUM TABLE {tables}") == before
    finally:
        conn.close()
    servers.admin(0, f"CREATE TABLE {db.table('fence_1')} (`u` INT) ENGINE=MEMORY")
    raw = RawClient(servers)
    try:
        for shard, applied in ((1, 0), (2, 1)):
            w = EntityWrite("", shard, _id(shard, 7), 20, 20, b"w", BLIND, True)
            sql, params, first = ownedsql.entity_batch_sql(db, [w], [], "fence_1")
            assert raw.run_counts(0, sql, params)[1][first] == applied
    finally:
        raw.close()


def test_a_read_batch_across_the_fence_is_detected(servers: Servers, db: ownedsql.OwnedDb) -> None:
    """The count comes after the rows: a fence that commits between them shows in the
    count; once the moved rows are gone, a batch still reports the shard, never an
    empty result taken for the truth."""
    read = f"SELECT `id` FROM {db.entities} WHERE `id` IN (%s, %s)"
    params = [_id(1), _id(2)]
    conn = _open(servers)
    raw = RawClient(servers)
    try:
        sets = raw.run(0, ownedsql.read_batch(db, [read], [1, 2]), params)
        assert len(sets[0]) == 2 and not ownedsql.stale_shards(sets, [1, 2])
        rows, _ = _exec(conn, read, params)  # a batch's rows are read ...
        servers.admin(0, ownedsql.fence_sql(db, 1))  # ... the fence commits ...
        count, _ = _exec(conn, ownedsql.count_sql(db, [1, 2]))  # ... then its count
        assert len(rows) == 2 and ownedsql.stale_shards([rows, count], [1, 2])
        servers.admin(0, f"DELETE FROM {db.entities} WHERE `shard` = 1")  # the move's cleanup
        sets = raw.run(0, ownedsql.read_batch(db, [read], [1]), [_id(1), _id(1)])
        assert sets[0] == () and ownedsql.stale_shards(sets, [1])
        sets = raw.run(0, ownedsql.read_batch(db, [read], [2]), params)
        assert len(sets[0]) == 1 and not ownedsql.stale_shards(sets, [2])
    finally:
        conn.close()
        raw.close()


def test_the_fence_waits_for_and_blocks_its_shard_only(
    servers: Servers, db: ownedsql.OwnedDb
) -> None:
    """Another shard's open writer does not delay the fence; an open fence (the row's
    DELETE not yet committed) blocks no other shard's writes; a write of the moved
    shard that meets it waits, then writes nothing."""
    other, fencer, late = _open(servers), _open(servers), _open(servers)
    try:
        assert _held(other, _shapes(db, 2)["upsert"]) >= 1  # shard 2's writer, left open
        t = time.perf_counter()
        _exec(fencer, "START TRANSACTION")
        assert _exec(fencer, ownedsql.fence_sql(db, 1))[1] == 1
        assert time.perf_counter() - t < HOLD  # not delayed by shard 2's writer
        sql, params = _shapes(db, 1)["insert"]
        thread, write = _timed(lambda: _exec(late, sql, params)[1])  # shard 1: waits
        sql2, params2 = _shapes(db, 2)["insert"]
        t = time.perf_counter()
        assert _exec(other, sql2, params2)[1] == 1  # shard 2: not blocked by the fence
        assert time.perf_counter() - t < HOLD
        time.sleep(HOLD)
        assert thread.is_alive()
        _exec(fencer, "COMMIT")
        _exec(other, "COMMIT")
        thread.join()
        assert write["result"] == 0 and write["seconds"] >= HOLD
        assert _owned(servers, db) == [2]
    finally:
        for conn in (other, fencer, late):
            conn.close()


def test_the_head_guard_delays_the_fence_then_refuses(
    servers: Servers, db: ownedsql.OwnedDb
) -> None:
    """The ``head`` guard's check holds the batch's shards' rows until the commit (the
    fence waits), and after the fence it ends the batch with error 1644 before any
    write (the step 2 batch's transaction is left to the client to roll back)."""
    head = ownedsql.OwnedDb(db.name, "head")
    write = EntityWrite("", 1, _id(1, 5), 9, 9, b"h", BLIND, False)
    sql, params, first = ownedsql.entity_batch_sql(head, [write])
    start, check, insert, commit = sql.split(";\n")
    assert (start, commit, first) == ("START TRANSACTION", "COMMIT", 2)
    writer, fencer = _open(servers), _open(servers)
    try:
        _exec(writer, start)
        _exec(writer, check)
        thread, fence = _timed(lambda: _exec(fencer, ownedsql.fence_sql(db, 1))[1])
        time.sleep(HOLD)
        assert thread.is_alive()
        assert _exec(writer, insert, params)[1] == 1
        _exec(writer, commit)
        thread.join()
        assert fence["result"] == 1 and fence["seconds"] >= HOLD
        late = EntityWrite("", 1, _id(1, 6), 9, 9, b"h", BLIND, False)
        sql, params, _ = ownedsql.entity_batch_sql(head, [late])
        with pytest.raises(MySQLdb.MySQLError) as refused:
            _run(writer, sql, params)
        assert refused.value.args[0] == 1644
        _exec(writer, "ROLLBACK")
        found = servers.admin(0, f"SELECT `id` FROM {db.entities} WHERE `shard` = 1")
        assert sorted(r[0] for r in found) == [_id(1), _id(1, 5)]
    finally:
        writer.close()
        fencer.close()


def _run(conn: Any, sql: str, params: list[Any]) -> None:
    """A whole multi-statement batch, to its end (or its first error)."""
    cur = conn.cursor()
    cur.execute(sql, params)
    while cur.nextset():
        pass
    cur.close()


def test_the_trigger_guard_delays_the_fence_then_refuses(servers: Servers) -> None:
    """The ``trigger`` variant: plain statements, the check in the tables' triggers. A
    write holds the row until its commit (the fence waits); after the fence an insert
    or update of the shard fails with error 1644 whatever statement sends it, and
    another shard's writes go on."""
    db = _create(servers, ownedsql.OwnedDb("ot_" + uuid.uuid4().hex[:10], "trigger"))
    shapes = {s: _shapes(db, s) for s in (1, 2)}
    writer, fencer = _open(servers), _open(servers)
    try:
        assert _held(writer, shapes[1]["insert"]) == 1
        thread, fence = _timed(lambda: _exec(fencer, ownedsql.fence_sql(db, 1))[1])
        time.sleep(HOLD)
        assert thread.is_alive()
        _exec(writer, "COMMIT")
        thread.join()
        assert fence["result"] == 1 and fence["seconds"] >= HOLD
        for shape in ("upsert", "update", "tombstone", "step 1", "step 1, 3 rows"):
            sql, params = shapes[1][shape]
            with pytest.raises(MySQLdb.MySQLError) as refused:
                _run(writer, sql, params)
            assert refused.value.args[0] == 1644, shape
            assert _held(writer, shapes[2][shape]) >= 1, shape
            _exec(writer, "ROLLBACK")
    finally:
        writer.close()
        fencer.close()
        servers.admin(0, f"DROP DATABASE {db.name}")
