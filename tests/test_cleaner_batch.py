"""Unit tests for the backfill's batch path (schemaless.cleaner.batch; no database):
the rows and placement it derives agree with the write protocol's, one entity at a time."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemaless import Index
from schemaless.cleaner.batch import Placement, derive, proof, runs
from schemaless.cleaner.sql import index_upserts_sql, rows_text, versions_proof_sql
from schemaless.codec import Codec
from schemaless.errors import CorruptEntity
from schemaless.hashing import shard_of
from schemaless.ids import new_id
from schemaless.index import key_encode
from schemaless.owned import CHECK

BY_TAG = Index("by_tag", {"tags": "str(5)", "n": "int"}, multi="tags")
BY_N = Index("by_n", {"n": "float"})
BY_INT = Index("by_int", {"n": "int"})
BY_KEYS = Index("by_keys", {"u": "uuid", "n": "int", "b": "bytes(4)", "f": "bool", "a": "auto"})


def _recover(key: bytes, version: int, body: bytes) -> dict[str, Any]:
    raise CorruptEntity(f"entity {key.hex()} is corrupt")


@given(st.lists(st.integers(min_value=1, max_value=400), unique=True), st.integers(1, 6))
def test_runs_cover_exactly_the_values(values: list[int], limit: int) -> None:
    added = sorted(values)
    out = runs(added, limit)
    expected = 0 if not added else 1 + sum(b != a + 1 for a, b in pairwise(added))
    if expected > limit:
        assert out is None
        return
    assert out is not None and len(out) == expected
    assert [v for first, last in out for v in range(first, last + 1)] == added


def test_derive_matches_the_index_and_shard_of() -> None:
    codec = Codec()
    entities = [{"id": new_id(), "tags": ["a", "b", "a"], "n": i % 3} for i in range(50)] + [
        {"id": new_id(), "n": 1},
        {"id": new_id(), "tags": ["toolong"], "n": 1},
    ]
    batch = [(i + 1, e["id"], 7 + i, codec.encode(e)) for i, e in enumerate(entities)]
    batch.append((99, new_id(), 3, None))  # a tombstone: no rows
    batch.append((100, new_id(), 4, b"\x09garbage"))
    place = Placement(16)
    out = derive(BY_TAG, codec, batch, place, _recover)

    expected: dict[int, list[tuple[Any, ...]]] = {}
    for _, key, version, body in batch[:50]:
        assert body is not None
        for values in BY_TAG.rows(codec.decode(body)):
            shard = shard_of(BY_TAG.shard_key(values), 16)
            expected.setdefault(shard, []).append((*values, key, version))
    assert out.targets == {s: sorted(rows) for s, rows in expected.items()}
    assert out.rows == 100  # two distinct tags each
    assert [key for key, _ in out.unfit] == [entities[-1]["id"]]
    assert [key for key, _ in out.corrupt] == [batch[-1][1]]
    assert "is corrupt" in str(out.corrupt[0][1])


def test_placement_memo_agrees_with_shard_of_for_equal_values() -> None:
    place = Placement(8, sample=100, limit=2)
    for value in [0.0, -0.0, 1.5, 0.0, 2.5, -0.0, 1.5]:
        assert place(BY_N.rows({"n": value}).pop()[0]) == shard_of(BY_N.shard_key((value,)), 8)
    assert place.known is not None and len(place.known) <= 2


def test_placement_drops_its_memo_when_values_do_not_repeat() -> None:
    repeating, unique = Placement(8, sample=100), Placement(8, sample=100)
    for i in range(300):
        assert repeating(i % 10) == shard_of(key_encode(i % 10), 8)
        assert unique(i) == shard_of(key_encode(i), 8)
    assert repeating.known is not None and len(repeating.known) == 10
    assert unique.known is None


def test_proof_and_its_sql() -> None:
    batch = [(3, b"a", 10, None), (4, b"b", 11, b"x"), (9, b"c", 5, b"y")]
    seen = proof(batch)
    assert (seen.runs, seen.count, seen.total) == ([(3, 4), (9, 9)], 3, 26)
    dbs = ["p_0000", "p_0001", "p_0002"]
    sql, params = versions_proof_sql(dbs, None, 2, [(3, 4), (9, 9)])
    assert sql.count("BETWEEN %s AND %s") == 2 and "`p_0002`.`entities`" in sql
    assert params == [3, 4, 9, 9] and CHECK not in sql
    # the owned layout: the shard's rows only, then the ownership check of that shard
    sql, params = versions_proof_sql(["p_data"] * 3, "p_data", 2, [(3, 4), (9, 9)])
    assert "`p_data`.`entities` WHERE `shard` = 2 AND (`added_id` BETWEEN" in sql
    assert sql.index(CHECK) > sql.index("BETWEEN") and "IN (2)) = 1" in sql
    assert params == [3, 4, 9, 9]


def test_index_upserts_sql_one_statement_per_table() -> None:
    groups = [(1, [("a", 1, b"k", 5)]), (3, [("a", 2, b"k", 5), ("b", 2, b"j", 6)])]
    sql, params = index_upserts_sql(["d0", "d1", "d2", "d3"], None, BY_TAG, groups)
    assert sql.startswith("START TRANSACTION") and sql.endswith("COMMIT")
    assert sql.count("INSERT INTO") == 2 and "`d3`.`index_by_tag`" in sql
    assert sql.count("%s") == len(params) == 12
    assert params[:4] == ["a", 1, b"k", 5]
    assert CHECK not in sql


def test_index_upserts_sql_in_the_owned_layout() -> None:
    """Each row begins with its shard; the locking check of every shard written comes
    first in the transaction (a unique index's owners are read in it, after)."""
    groups = [(1, [("a", 1, b"k", 5)]), (3, [("a", 2, b"k", 5), ("b", 2, b"j", 6)])]
    sql, params = index_upserts_sql(["d"] * 4, "d", BY_TAG, groups)
    assert sql.count("INSERT INTO `d`.`index_by_tag` (`shard`, ") == 2
    assert sql.count("%s") == len(params) == 15
    assert params[:5] == [1, "a", 1, b"k", 5] and params[5] == params[10] == 3
    assert sql.index(CHECK) < sql.index("INSERT") and "IN (1, 3) LOCK IN SHARE MODE) < 2" in sql
    unique = Index("u", {"n": "int"}, unique=True)
    sql, _ = index_upserts_sql(["d"] * 4, "d", unique, [(2, [(7, b"k", 1)])])
    assert sql.index(CHECK) < sql.index("INSERT") < sql.index("SELECT `p_n`") < sql.index("COMMIT")


def test_index_upserts_sql_renders_integer_and_byte_rows() -> None:
    groups = [(0, [(-5, b"\x00\xff", 9)]), (2, [(1, b"k", 2**63), (7, b"", 1)])]
    sql, params = index_upserts_sql(["d0", "d1", "d2"], None, BY_INT, groups)
    assert params == [] and "%s" not in sql
    assert "VALUES (-5,X'00ff',9) ON DUPLICATE" in sql
    assert f"VALUES (1,X'6b',{2**63}),(7,X'',1) ON DUPLICATE" in sql
    assert sql.startswith("START TRANSACTION") and sql.count("INSERT INTO") == 2
    sql, params = index_upserts_sql(["d"] * 3, "d", BY_INT, groups)
    assert params == [] and "%s" not in sql
    assert "(`shard`, `p_n`, `entity_id`, `entity_version`) VALUES (0,-5,X'00ff',9) ON" in sql
    assert f"VALUES (2,1,X'6b',{2**63}),(2,7,X'',1) ON DUPLICATE" in sql
    assert sql.index(CHECK) < sql.index("COMMIT")


def test_rows_text_of_each_type_and_where_it_declines() -> None:
    render = rows_text(BY_KEYS)
    assert render is not None
    values = BY_KEYS.rows({"u": bytes(16), "n": -1, "b": b"ab", "f": True, "a": "x"}).pop()
    text = render([(*values, b"\x01", 3), (*values, b"", 2**63)])
    row = f"X'{bytes(16).hex()}',-1,X'6162',1,X'{values[4].hex()}'"
    assert text == f"({row},X'01',3),({row},X'',{2**63})"
    assert render([(*values, b"\x01", 3)], 9) == f"(9,{row},X'01',3)"  # the owned layout's
    unique = Index("u_int", {"n": "int"}, unique=True)
    assert rows_text(BY_TAG) is None and rows_text(BY_N) is None and rows_text(unique) is None


def test_rows_text_refuses_what_is_not_an_int_or_bytes() -> None:
    render = rows_text(BY_INT)
    assert render is not None and render([(1, b"k", 2)]) == "(1,X'6b',2)"
    for bad in [("1) OR (1", b"k", 2), (1, "6b'", 2), (1, b"k", "2)")]:
        with pytest.raises((TypeError, AttributeError)):
            render([bad])
