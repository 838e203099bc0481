"""The owned layout's statement builders (bench/ownedsql.py): every statement that
writes names its shard's ``owned`` row under a shared lock, and every read batch ends
with the count of the shards it read.  Pure: no server."""

from __future__ import annotations

import itertools
import re

import pytest

from bench import ownedsql
from bench.env import RawClient, Servers
from bench.layouts import OwnedLayout, Placement
from bench.layoutwrites import OwnedWrites, TodayWrites
from bench.ops import BY_FEED, BY_TIME, BY_USER
from schemaless.codec import Codec as EntityCodec
from schemaless.index import Index
from schemaless.writes import BLIND, CREATE, NEW, EntityWrite, IndexRow, WriteMode

DB = ownedsql.OwnedDb("own_one")
OWNED = "`own_one`.`owned`"
UNIQUE = Index("by_name", {"name": "str(20)"}, unique=True)
INDEXES = (BY_USER, BY_TIME, BY_FEED, UNIQUE)
MODES = (NEW, BLIND, CREATE, WriteMode.expect(3))
_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.I)


def _guarded(stmt: str, shard: int) -> bool:
    """Whether a writing statement reads shard ``shard``'s owned row under a lock: an
    ``INSERT ... SELECT`` from it ``LOCK IN SHARE MODE``, or a multi-table write
    joined to it (InnoDB takes a shared lock on the rows such a statement only reads)."""
    select = f" FROM {OWNED} WHERE {OWNED}.`shard` = {shard} LOCK IN SHARE MODE"
    joined = f" JOIN {OWNED} ON {OWNED}.`shard` = "
    if stmt.startswith("INSERT"):
        return " SELECT " in stmt and (select in stmt or select.replace(" FROM ", ", ") in stmt)
    return joined in stmt and f"AND {OWNED}.`shard` = {shard} " in stmt


def _writes(sql: str) -> list[str]:
    return [s for s in sql.split(";\n") if _WRITE.match(s)]


def _row(index: Index, shard: int, k: int = 0) -> IndexRow:
    values = {
        "by_user": (bytes(16), k),
        "by_time": (k,),
        "by_feed": (bytes([k]) * 16,),
        "by_name": (f"n{k}",),
    }[index.name]
    return IndexRow(index, shard, values, bytes([k]) * 16, 5)


@pytest.mark.parametrize(
    ("mode", "delete", "want_body", "fence"),
    list(itertools.product(MODES, (False, True), (False, True), (None, "fence_1"))),
)
def test_every_entity_write_names_its_owned_row(
    mode: WriteMode, delete: bool, want_body: bool, fence: str | None
) -> None:
    writes = [
        EntityWrite("unused", shard, bytes([shard % 256]) * 16, 9, 9, None if delete else b"b",
                    mode, want_body)
        for shard in (7, 3, 300)
    ]  # fmt: skip
    rows = [_row(BY_USER, 3), _row(BY_TIME, 7)]
    sql, params, first = ownedsql.entity_batch_sql(DB, writes, rows, fence)
    stmts = sql.split(";\n")
    assert sql.count("%s") == len(params)
    written = _writes(sql)
    assert len(written) == len(rows) + len(writes)
    # the shards in step 2's order (upserts first, then the writes by shard and id)
    for stmt, shard in zip(written, [3, 7, 3, 7, 300], strict=True):
        assert _guarded(stmt, shard), stmt
    # the first write's position among the statements without a result set
    no_result = [s for s in stmts if not s.startswith("SELECT")]
    assert no_result[first] == written[len(rows)]
    if want_body:
        assert sum(s.startswith("SELECT `body`") for s in stmts) == len(writes)


@pytest.mark.parametrize(("index", "rows"), list(itertools.product(INDEXES, (1, 3))))
def test_every_index_write_names_its_owned_row(index: Index, rows: int) -> None:
    group = [_row(index, 11, k) for k in range(rows)]
    for build in (ownedsql.upsert_rows_sql, ownedsql.delete_rows_sql):
        sql, params = build(DB, [*group, _row(index, 12)])
        assert sql.count("%s") == len(params)
        written = _writes(sql)
        shards = [11, 12] if build is ownedsql.upsert_rows_sql else [11] * rows + [12]
        assert len(written) == len(shards)
        for stmt, shard in zip(written, shards, strict=True):
            assert _guarded(stmt, shard), stmt
            assert f"`own_one`.`{index.table}`" in stmt
    upsert = ownedsql.upsert_sql(DB, index, 4, rows)
    # a unique claim never takes a row of another entity (today's tail)
    assert ("IF(`entity_id` = VALUES(`entity_id`)" in upsert) is index.unique
    if rows > 1:  # the derived table's first row types the binary columns
        assert upsert.count("_binary %s") == 1 + (index.types[0].sql.startswith("BINARY"))


def test_the_guard_is_not_a_substring_accident() -> None:
    """The checker refuses the unguarded shapes (today's, and a guard on another shard)."""
    assert not _guarded("INSERT INTO `own_one`.`entities` VALUES (%s)", 3)
    assert not _guarded(ownedsql.entity_sql(DB, 4, "new", False, None), 3)
    assert not _guarded(ownedsql.entity_sql(DB, 4, "delete", False, None), 3)
    nolock = ownedsql.entity_sql(DB, 3, "new", False, None).replace(" LOCK IN SHARE MODE", "")
    assert not _guarded(nolock, 3)


def test_every_read_batch_counts_its_shards() -> None:
    batch = ownedsql.read_batch(DB, ["SELECT 1", "SELECT 2"], [5, 2, 5])
    assert batch.split(";\n")[-1] == f"SELECT COUNT(*) FROM {OWNED} WHERE `shard` IN (2, 5)"
    assert ownedsql.stale_shards([[(1,)], [(2,)]], [2, 5]) is False
    assert ownedsql.stale_shards([[(1,)], [(1,)]], [2, 5]) is True
    assert ownedsql.fence_sql(DB, 5) == f"DELETE FROM {OWNED} WHERE `shard` = 5"


def test_the_owned_layouts_reads_end_with_the_count() -> None:
    """get_many, the equality query and the scatter of bench/layouts.py's d_owned: each
    server's batch ends with the count of exactly the shards it read."""
    place = Placement("own", 8, 2)
    raw = RawClient(Servers(("127.0.0.1:1",), "unused"))  # never connects
    layout = OwnedLayout(place, raw, EntityCodec())
    count = "SELECT COUNT(*) FROM `own_one`.`owned` WHERE `shard` IN "
    calls = {
        0: (*layout.fetch_sql({2: [b"a"], 4: [b"b"]}), [2, 4]),
        1: (layout.eq_sql(3), [b"u"], [3]),
    }
    scatter = {0: (*layout.scatter_sql(place.shards_on(0), b"x"), place.shards_on(0))}
    for batches, expect in (
        (layout.batches(calls), {0: "(2, 4)", 1: "(3)"}),
        (layout.batches(scatter), {0: "(0, 2, 4, 6)"}),
    ):
        for sid, (sql, _) in batches.items():
            assert sql.split(";\n")[-1] == count + expect[sid]


def test_a_head_guarded_batch_checks_all_its_shards_first() -> None:
    """The ``head`` variant: every batch (steps 1, 2 and 3) is one transaction that
    first counts the rows of all the shards it writes, under a shared lock."""
    head = ownedsql.OwnedDb("own_one", "head")
    writes = [EntityWrite("", s, bytes([s]) * 16, 9, 9, b"b", BLIND, True) for s in (7, 3)]
    rows = [_row(BY_USER, 3), _row(BY_TIME, 12)]
    batches = {
        (3, 7, 12): ownedsql.entity_batch_sql(head, writes, rows)[0],
        (3, 12): ownedsql.upsert_rows_sql(head, rows)[0],
        (12, 3): ownedsql.delete_rows_sql(head, rows)[0],
        (3,): ownedsql.delete_rows_sql(head, rows[:1])[0],
    }
    for shards, sql in batches.items():
        stmts = sql.split(";\n")
        assert (stmts[0], stmts[-1]) == ("START TRANSACTION", "COMMIT")
        assert stmts[1] == ownedsql.head_sql(head, shards)
        named = ", ".join(str(s) for s in sorted(shards))
        assert f"WHERE `shard` IN ({named}) LOCK IN SHARE MODE) < {len(shards)} " in stmts[1]
        assert "SIGNAL SQLSTATE" in stmts[1] and all(OWNED not in s for s in stmts[2:])


def test_the_trigger_guard_covers_every_table() -> None:
    """``trigger``: each table (entities, every index) checks inserts and updates."""
    db = ownedsql.OwnedDb("own_one", "trigger")
    ddl = db.ddl(INDEXES, [1, 2])
    for table in ["entities", *(index.table for index in INDEXES)]:
        for when in ("INSERT", "UPDATE"):
            (trigger,) = [s for s in ddl if f" BEFORE {when} ON `own_one`.`{table}` " in s]
            assert f"FROM {OWNED} WHERE `shard` = NEW.`shard` LOCK IN SHARE MODE" in trigger
            assert "SIGNAL SQLSTATE" in trigger
    assert not any("TRIGGER" in s for s in ownedsql.OwnedDb("own_one").ddl(INDEXES, [1]))
    # its statements are the plain ones: no read of the owned table of their own
    sql, _, _ = ownedsql.entity_batch_sql(
        db, [EntityWrite("", 1, b"k" * 16, 9, 9, b"b", NEW, False)]
    )
    assert OWNED not in sql


def test_a_unique_claims_owner_read_ends_with_the_count() -> None:
    """Step 1 with a unique index reads the values' owners back: in the owned layout
    that batch is a read batch too (a stale owner would make a false violation)."""
    place = Placement("own", 8, 2)
    raw = RawClient(Servers(("127.0.0.1:1",), "unused"))  # never connects
    rows = [_row(UNIQUE, 5, 1), _row(UNIQUE, 3, 2), _row(BY_TIME, 3)]
    sql, params = OwnedWrites(place, raw).claims(rows)
    stmts = sql.split(";\n")
    assert stmts[-1] == f"SELECT COUNT(*) FROM {OWNED} WHERE `shard` IN (3, 5)"
    owners = [s for s in stmts if s.startswith("SELECT `p_name`, `entity_id`")]
    assert len(owners) == 2 and sql.count("%s") == len(params)
    assert all(_guarded(s, shard) for s, shard in zip(_writes(sql), (3, 3, 5), strict=True))
    today_sql, _ = TodayWrites(place, raw).claims(rows)
    assert "owned" not in today_sql and today_sql.count("SELECT `p_name`") == 2
