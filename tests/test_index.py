"""Unit tests for schemaless.index (no database)."""

from __future__ import annotations

import json
import math
import struct
import uuid
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from schemaless.errors import IndexDefinitionError, InvalidEntity, InvalidQuery
from schemaless.index import ColumnType, Index, key_encode, parse_type


def sign(x: int) -> int:
    return (x > 0) - (x < 0)


def cmp(a: Any, b: Any) -> int:
    return sign((a > b) - (a < b))


# -- key_encode ------------------------------------------------------------------------

ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
floats = st.floats(allow_nan=False, allow_infinity=False)
texts = st.text()  # hypothesis never generates lone surrogates in st.text()
blobs = st.binary()


@pytest.mark.parametrize(
    "strategy", [ints, floats, texts, blobs], ids=["int", "float", "str", "bytes"]
)
def test_key_encode_preserves_order(strategy: st.SearchStrategy[Any]) -> None:
    @given(strategy, strategy)
    def check(a: Any, b: Any) -> None:
        ka, kb = key_encode(a), key_encode(b)
        assert cmp(ka, kb) == cmp(a, b)
        assert (ka == kb) == (a == b)

    check()


@given(floats)
def test_float_encoding_is_eight_bytes(v: float) -> None:
    assert len(key_encode(v)) == 9


def test_key_encode_exact_bytes() -> None:
    assert key_encode(True) == b"\x01\x01"
    assert key_encode(False) == b"\x01\x00"
    assert key_encode(0) == b"\x02\x80" + b"\x00" * 7
    assert key_encode(-1) == b"\x02\x7f" + b"\xff" * 7
    assert key_encode(-(2**63)) == b"\x02" + b"\x00" * 8
    assert key_encode(2**63 - 1) == b"\x02" + b"\xff" * 8
    assert key_encode(1.0) == b"\x03" + bytes([0xBF, 0xF0]) + b"\x00" * 6
    assert key_encode(-1.0) == b"\x03" + bytes(b ^ 0xFF for b in struct.pack(">d", -1.0))
    assert key_encode("é") == b"\x04\xc3\xa9"
    assert key_encode(b"\x00\xff") == b"\x05\x00\xff"


def test_key_encode_canonical_equalities() -> None:
    u = uuid.uuid4()
    assert key_encode(u) == key_encode(u.bytes) == b"\x05" + u.bytes
    assert key_encode(-0.0) == key_encode(0.0)
    # the tag keeps types apart
    assert key_encode(1) != key_encode(1.0) != key_encode(True)
    assert key_encode("a") != key_encode(b"a")


def test_key_encode_subclasses() -> None:
    import enum

    class Color(enum.IntEnum):
        RED = 3

    class Name(str):
        pass

    assert key_encode(Color.RED) == key_encode(3)
    assert key_encode(Name("x")) == key_encode("x")


def test_key_encode_tags_order_types() -> None:
    assert key_encode(True) < key_encode(-(2**63)) < key_encode(-1e308)
    assert key_encode(1e308) < key_encode("") < key_encode(b"")


@pytest.mark.parametrize(
    ("value", "exc"),
    [
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        (2**63, ValueError),
        (-(2**63) - 1, ValueError),
        ("\ud800", ValueError),
        ("ok\udfffok", ValueError),
        (None, TypeError),
        ([1], TypeError),
        ({"a": 1}, TypeError),
        (bytearray(b"x"), TypeError),
        (object(), TypeError),
    ],
)
def test_key_encode_refusals(value: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        key_encode(value)


# -- parse_type ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "sql", "key_bytes"),
    [
        ("uuid", "uuid", "BINARY(16)", 16),
        ("binary16", "uuid", "BINARY(16)", 16),
        ("UUID", "uuid", "BINARY(16)", 16),
        (
            "str(200)",
            "str(200)",
            "VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin",
            800,
        ),
        (" String ( 10 ) ", "str(10)", None, 40),
        ("str(768)", "str(768)", None, 3072),
        ("str(1)", "str(1)", None, 4),
        ("bytes(32)", "bytes(32)", "VARBINARY(32)", 32),
        ("BYTES(3072)", "bytes(3072)", "VARBINARY(3072)", 3072),
        ("int", "int", "BIGINT", 8),
        (" Int ", "int", "BIGINT", 8),
        ("float", "float", "DOUBLE", 8),
        ("bool", "bool", "TINYINT", 1),
        ("auto", "auto", "VARBINARY(767)", 767),
        ("str(007)", "str(7)", None, 28),
    ],
)
def test_parse_type_accepts(text: str, name: str, sql: str | None, key_bytes: int) -> None:
    t = parse_type(text)
    assert t.name == name
    assert t.key_bytes == key_bytes
    if sql is not None:
        assert t.sql == sql
    assert parse_type(t.name) == t  # canonical spelling round-trips


@pytest.mark.parametrize(
    "text",
    [
        "",
        "text",
        "varchar(10)",
        "str",
        "str()",
        "str(0)",
        "str(769)",
        "str(-1)",
        "str(1.5)",
        "bytes(0)",
        "bytes(3073)",
        "binary(16)",
        "bytes",
        "int(11)",
        "str(10",
        "s tr(10)x",
        "uuid; DROP TABLE x",
        "str(10) CHARACTER SET latin1",
        "str(99999999999)",
    ],
)
def test_parse_type_refuses(text: str) -> None:
    with pytest.raises(IndexDefinitionError):
        parse_type(text)


def test_parse_type_refuses_non_str() -> None:
    with pytest.raises(IndexDefinitionError):
        parse_type(16)  # type: ignore[arg-type]


def test_column_type_direct_construction_is_checked() -> None:
    assert ColumnType("int", "BIGINT", 8) == parse_type("int")
    with pytest.raises(ValueError):
        ColumnType("int", "VARCHAR(10)", 8)
    with pytest.raises(ValueError):
        ColumnType("text", "TEXT", 8)


# -- ColumnType.coerce -----------------------------------------------------------------


def reason(t: ColumnType, value: object) -> str:
    with pytest.raises(ValueError) as info:
        t.coerce(value)
    return str(info.value)


def test_coerce_uuid() -> None:
    t = parse_type("uuid")
    u = uuid.uuid4()
    assert t.coerce(u) == u.bytes
    assert t.coerce(u.bytes) == u.bytes
    assert "16 bytes" in reason(t, b"x" * 15)
    assert "got str" in reason(t, str(u))


def test_coerce_str() -> None:
    t = parse_type("str(255)")
    assert t.coerce("héllo 🙂") == "héllo 🙂"
    assert t.coerce("🙂" * 255) == "🙂" * 255  # code points, not bytes
    assert reason(t, "x" * 300) == "str of 300 characters is longer than str(255)"
    assert "surrogate" in reason(t, "a\ud800")
    assert reason(t, b"x") == "expected str, got bytes"
    assert reason(t, 5) == "expected str, got int"


def test_coerce_bytes() -> None:
    t = parse_type("bytes(4)")
    assert t.coerce(b"abcd") == b"abcd"
    assert reason(t, b"abcde") == "bytes of 5 bytes is longer than bytes(4)"
    assert reason(t, "abc") == "expected bytes, got str"


def test_coerce_int() -> None:
    t = parse_type("int")
    assert t.coerce(-(2**63)) == -(2**63)
    assert t.coerce(2**63 - 1) == 2**63 - 1
    assert reason(t, True) == "bool is not an int"
    assert reason(t, 1.0) == "expected int, got float"
    assert "64-bit" in reason(t, 2**63)
    assert "64-bit" in reason(t, 10**5000)  # no int->str conversion limit trouble


def test_coerce_float() -> None:
    t = parse_type("float")
    assert t.coerce(3) == 3.0
    assert type(t.coerce(3)) is float
    assert math.copysign(1.0, t.coerce(-0.0)) == 1.0  # type: ignore[arg-type]
    assert reason(t, math.nan) == "NaN cannot be indexed"
    assert "inf" in reason(t, math.inf)
    assert "inf" in reason(t, -math.inf)
    assert reason(t, False) == "bool is not a float"
    assert reason(t, "1.5") == "expected float, got str"
    assert "exactly" in reason(t, 2**53 + 1)
    assert t.coerce(2**60) == float(2**60)  # exactly representable
    assert "too large" in reason(t, 10**400)


def test_coerce_bool() -> None:
    t = parse_type("bool")
    assert t.coerce(True) == 1
    assert t.coerce(False) == 0
    assert reason(t, 1) == "expected bool, got int"


def test_coerce_auto() -> None:
    t = parse_type("auto")
    assert t.coerce("abc") == key_encode("abc")
    assert t.coerce(5) == key_encode(5)
    assert t.coerce(uuid.UUID(int=7)) == key_encode(uuid.UUID(int=7).bytes)
    assert t.coerce("x" * 766) == key_encode("x" * 766)
    assert "declare a typed str(N)" in reason(t, "x" * 767)
    assert reason(t, math.nan) == "NaN cannot be indexed"
    assert "cannot be indexed" in reason(t, {"a": 1})


def test_tag_bounds() -> None:
    auto = parse_type("auto")
    lo, hi = auto.tag_bounds(auto.coerce(5))  # type: ignore[misc]
    assert (lo, hi) == (b"\x02", b"\x03")
    for v in (-(2**63), 0, 2**63 - 1):
        assert lo <= auto.coerce(v) < hi  # type: ignore[operator]
    lo, hi = auto.tag_bounds(auto.coerce("zz"))  # type: ignore[misc]
    assert lo <= auto.coerce("\U0010ffff" * 100) < hi  # type: ignore[operator]
    assert parse_type("int").tag_bounds(5) is None
    assert parse_type("str(5)").tag_bounds("x") is None


# -- Index construction ----------------------------------------------------------------


def test_friendfeed_post_form() -> None:
    index = Index(table="index_user_id", properties=["user_id"], shard_on="user_id")
    assert index.name == "user_id"
    assert index.table == "index_user_id"
    assert index.properties == ("user_id",)
    assert index.types == (parse_type("auto"),)
    assert index.columns == ("p_user_id",)
    assert index.shard_on == "user_id"
    assert index.shard_pos == 0
    assert index.multi is None


def test_construction_forms_agree() -> None:
    forms = [
        Index("feed", ["user_id:uuid", "published:int"]),
        Index("feed", [("user_id", "uuid"), ("published", "int")]),
        Index("feed", {"user_id": "uuid", "published": "int"}),
        Index(table="index_feed", properties=["user_id: UUID", "published:INT"]),
        Index("feed", ["user_id:binary16", "published:int"], shard_on="user_id"),
        Index(
            name="feed", table="index_feed", properties=[["user_id", "uuid"], ["published", "int"]]
        ),
    ]
    for f in forms:
        assert f == forms[0]
        assert hash(f) == hash(forms[0])
        assert f.shard_on == "user_id"
        assert f.types == (parse_type("uuid"), parse_type("int"))


def test_definition_inequality() -> None:
    base = Index("x", ["a:int", "b:int"])
    assert base != Index("x", ["a:int", "b:int"], shard_on="b")
    assert base != Index("x", ["b:int", "a:int"])
    assert base != Index("x", ["a:int", "b:float"])
    assert base != Index("y", ["a:int", "b:int"])
    assert base != Index("x", ["a:int", "b:int"], multi="b")
    assert base != "x"


def test_shard_on_and_multi() -> None:
    index = Index("by_tag", ["tag:str(50)", "published:int"], shard_on="published", multi="tag")
    assert index.shard_pos == 1
    assert index.multi == "tag"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"properties": ["a"]},  # no name
        {"name": "x"},  # no properties
        {"name": "x", "properties": []},
        {"name": "x", "properties": [f"p{i}" for i in range(9)]},
        {"name": "x", "properties": "a"},  # a str, not a list
        {"name": "x", "properties": ["a", "a"]},
        {"name": "x", "properties": ["a", "A"]},
        {"name": "x", "properties": ["userId", "USERID:int"]},
        {"name": "x", "properties": ["a"], "shard_on": "b"},
        {"name": "x", "properties": ["a"], "multi": "b"},
        {"name": "x", "properties": ["a:text"]},
        {"name": "x", "properties": [("a", 5)]},
        {"name": "x", "properties": [("a", "int", "x")]},
        {"name": "x", "properties": [5]},
        {"name": "x", "properties": ["a" * 63]},  # p_ + 63 > 64
        {"table": "user_id", "properties": ["a"]},
        {"table": "index_", "properties": ["a"]},
        {"name": "a", "table": "index_b", "properties": ["a"]},
        # key size: 4 auto columns = 3068 + 16 > 3072
        {"name": "x", "properties": ["a", "b", "c", "d"]},
        {"name": "x", "properties": ["a:str(768)"]},
        {"name": "x", "properties": ["a:bytes(3057)"]},
    ],
)
def test_index_refusals(kwargs: dict[str, Any]) -> None:
    with pytest.raises(IndexDefinitionError):
        Index(**kwargs)


@pytest.mark.parametrize(
    "name",
    [
        "a`b",
        "x; DROP TABLE y",
        "a--",
        "a b",
        "Upper",
        "1abc",
        "_x",
        "",
        "x" * 49,
        "abc\n",
        "é",
        "a.b",
        "a'b",
        'a"b',
        "a\x00",
    ],
)
def test_bad_index_names(name: str) -> None:
    with pytest.raises(IndexDefinitionError, match="index name"):
        Index(name, ["a"])
    with pytest.raises(IndexDefinitionError):
        Index(table="index_" + name, properties=["a"])


@pytest.mark.parametrize(
    "prop", ["a`b", "x; DROP TABLE y", "a--", "a b", "1a", "", "a\n", "é", "a-b"]
)
def test_bad_property_names(prop: str) -> None:
    with pytest.raises(IndexDefinitionError, match="property name"):
        Index("x", [prop])
    with pytest.raises(IndexDefinitionError):
        Index("x", {prop: "int"})


def test_key_size_limit_boundary() -> None:
    Index("x", ["a:str(764)"])  # 3056 + 16 = 3072
    Index("x", ["a:bytes(3056)"])
    Index("x", ["a", "b", "c", "d:int", "e:int"])
    with pytest.raises(IndexDefinitionError, match="3072"):
        Index("x", ["a:str(765)"])


def test_limits_accepted() -> None:
    Index("x" * 48, ["a"])
    Index("x", [f"p{i}:int" for i in range(8)])
    Index("x", ["a" * 62])


# -- rows ------------------------------------------------------------------------------

UID = bytes.fromhex("00" * 15 + "01")


def test_rows_simple_and_absent() -> None:
    index = Index(table="index_user_id", properties=["user_id"], shard_on="user_id")
    assert index.rows({"user_id": UID}) == {(key_encode(UID),)}
    assert index.rows({}) == set()
    assert index.rows({"user_id": None}) == set()
    assert index.rows({"User_Id": UID}) == set()  # entity keys are case-sensitive


def test_rows_compound() -> None:
    index = Index("feed", ["user_id:uuid", "published:int"])
    entity = {"id": b"i" * 16, "user_id": UID, "published": 1234, "title": "t"}
    assert index.rows(entity) == {(UID, 1234)}
    assert index.rows({"user_id": UID}) == set()
    assert index.rows({"user_id": uuid.UUID(bytes=UID), "published": 5}) == {(UID, 5)}


def test_rows_multi() -> None:
    index = Index("by_tag", ["user_id:uuid", "tags:str(20)", "n:int"], multi="tags")
    entity = {"user_id": UID, "tags": ["a", "b", "a", None, "c"], "n": 1}
    assert index.rows(entity) == {(UID, "a", 1), (UID, "b", 1), (UID, "c", 1)}
    assert index.rows({**entity, "tags": []}) == set()
    assert index.rows({**entity, "tags": [None]}) == set()
    assert index.rows({**entity, "tags": None}) == set()
    assert index.rows({**entity, "tags": ("x",)}) == {(UID, "x", 1)}
    assert index.rows({**entity, "n": None}) == set()
    with pytest.raises(InvalidEntity, match="property 'tags' of index 'by_tag' must be a list"):
        index.rows({**entity, "tags": "a"})
    with pytest.raises(InvalidEntity, match=r"tags.*by_tag.*longer than str"):
        index.rows({**entity, "tags": ["a", "x" * 21]})
    with pytest.raises(InvalidEntity, match="expected str, got list"):
        index.rows({**entity, "tags": [["nested"]]})


def test_rows_multi_float_duplicates_collapse() -> None:
    index = Index("scores", ["s:float"], multi="s")
    assert index.rows({"s": [1, 1.0, -0.0, 0.0, 2]}) == {(1.0,), (0.0,), (2.0,)}


def test_rows_multi_auto() -> None:
    index = Index("by_tag", ["tags"], multi="tags")
    assert index.rows({"tags": ["x", 1, "x"]}) == {(key_encode("x"),), (key_encode(1),)}


def test_rows_list_in_scalar_property() -> None:
    index = Index("x", ["a:int"])
    with pytest.raises(InvalidEntity, match=r"'a'.*'x'.*list"):
        index.rows({"a": [1, 2]})


@pytest.mark.parametrize(
    ("ptype", "value", "why"),
    [
        ("str(5)", "x" * 6, "str of 6 characters is longer than str(5)"),
        ("str(5)", 5, "expected str, got int"),
        ("int", 1.5, "expected int, got float"),
        ("int", True, "bool is not an int"),
        ("int", 2**64, "64-bit"),
        ("float", math.nan, "NaN cannot be indexed"),
        ("float", True, "bool is not a float"),
        ("bool", 1, "expected bool, got int"),
        ("uuid", b"short", "16 bytes"),
        ("bytes(2)", b"abc", "longer than bytes(2)"),
        ("auto", "x" * 1000, "declare a typed str"),
        ("auto", {"a": 1}, "dict"),
    ],
)
def test_rows_refuse_bad_values(ptype: str, value: object, why: str) -> None:
    index = Index("idx", [f"prop:{ptype}"])
    with pytest.raises(InvalidEntity) as info:
        index.rows({"prop": value})
    message = str(info.value)
    assert "'prop'" in message
    assert "'idx'" in message
    assert why in message


def test_rows_int_as_float() -> None:
    index = Index("x", ["a:float", "b:bool"])
    ((a, b),) = index.rows({"a": 7, "b": True})
    assert a == 7.0
    assert type(a) is float
    assert b == 1


# -- queries, placement ----------------------------------------------------------------


def test_coerce_query_value() -> None:
    index = Index("by_tag", ["user_id:uuid", "tags:str(20)", "n"], multi="tags")
    assert index.coerce_query_value("user_id", uuid.UUID(bytes=UID)) == UID
    assert index.coerce_query_value("tags", "a") == "a"
    assert index.coerce_query_value("n", 3) == key_encode(3)
    with pytest.raises(InvalidQuery, match="user_id, tags, n"):
        index.coerce_query_value("nope", 1)
    with pytest.raises(InvalidQuery, match="longer than str"):
        index.coerce_query_value("tags", "x" * 21)
    with pytest.raises(InvalidQuery):
        index.coerce_query_value("tags", ["a"])
    with pytest.raises(InvalidQuery):
        index.coerce_query_value("user_id", None)
    with pytest.raises(InvalidQuery, match="NaN"):
        Index("f", ["f:float"]).coerce_query_value("f", math.nan)


def test_shard_key() -> None:
    index = Index("feed", ["published:int", "user_id:uuid"], shard_on="user_id")
    (row,) = index.rows({"user_id": UID, "published": 5})
    assert index.shard_key(row) == key_encode(UID)
    auto = Index(table="index_user_id", properties=["user_id"], shard_on="user_id")
    (row,) = auto.rows({"user_id": UID})
    assert auto.shard_key(row) == key_encode(key_encode(UID))
    # query-side placement agrees with write-side placement
    q = auto.coerce_query_value("user_id", uuid.UUID(bytes=UID))
    assert key_encode(q) == auto.shard_key(row)


# -- DDL -------------------------------------------------------------------------------


def test_create_table_sql() -> None:
    index = Index("feed", ["user_id:uuid", "title:str(200)", "score"])
    sql = index.create_table_sql("sl_0003")
    assert sql.startswith("CREATE TABLE IF NOT EXISTS `sl_0003`.`index_feed` (")
    assert "`p_user_id` BINARY(16) NOT NULL" in sql
    assert "`p_title` VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL" in sql
    assert "`p_score` VARBINARY(767) NOT NULL" in sql
    assert "`entity_id` BINARY(16) NOT NULL" in sql
    assert "`entity_version` BIGINT UNSIGNED NOT NULL" in sql
    assert "PRIMARY KEY (`p_user_id`, `p_title`, `p_score`, `entity_id`)" in sql
    assert "KEY `by_entity` (`entity_id`)" in sql
    assert sql.endswith("ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin")
    assert ";" not in sql


def test_create_table_sql_quotes_reserved_looking_names() -> None:
    index = Index("select", ["select:int", "from", "order:str(3)"])
    sql = index.create_table_sql("db")
    assert "`db`.`index_select`" in sql
    assert "`p_select` BIGINT" in sql
    assert "`p_from` VARBINARY(767)" in sql
    assert "PRIMARY KEY (`p_select`, `p_from`, `p_order`, `entity_id`)" in sql


def test_create_table_sql_refuses_bad_database() -> None:
    index = Index("x", ["a"])
    for db in ["a`b", "x; DROP DATABASE y", ""]:
        with pytest.raises(IndexDefinitionError):
            index.create_table_sql(db)


# -- serialisation ---------------------------------------------------------------------


def test_to_dict_round_trip() -> None:
    index = Index(
        "by_tag", ["tags:str(20)", "user_id", "n:float"], shard_on="user_id", multi="tags"
    )
    d = index.to_dict()
    assert d == {
        "name": "by_tag",
        "properties": [["tags", "str(20)"], ["user_id", "auto"], ["n", "float"]],
        "shard_on": "user_id",
        "multi": "tags",
    }
    again = Index.from_dict(json.loads(json.dumps(d)))
    assert again == index
    assert hash(again) == hash(index)
    assert again.to_dict() == d
    assert {index, again} == {index}


@pytest.mark.parametrize(
    "d",
    [
        {},
        {"name": "x"},
        {"properties": [["a", "int"]]},
        {"name": "x", "properties": "a"},
        {"name": "x", "properties": [["a", "int"]], "extra": 1},
        {"name": "x", "properties": [["a", "nope"]]},
        {"name": "X", "properties": [["a", "int"]]},
        [],
    ],
)
def test_from_dict_refusals(d: Any) -> None:
    with pytest.raises(IndexDefinitionError):
        Index.from_dict(d)


def test_repr_round_trips() -> None:
    index = Index("by_tag", ["tags:str(20)", "user_id"], shard_on="user_id", multi="tags")
    text = repr(index)
    assert text == (
        "Index('by_tag', ['tags:str(20)', 'user_id:auto'], shard_on='user_id', multi='tags')"
    )
    assert eval(text, {"Index": Index}) == index


_REFILTER = Index("tagged", {"tags": "int", "name": "str(8)"}, shard_on="name", multi="tags")
_small = st.one_of(st.integers(-3, 3), st.booleans(), st.none())


@given(
    tags=st.one_of(
        st.lists(st.integers(-3, 3), min_size=1, max_size=4),
        st.lists(_small, max_size=4),
        _small,
    ),
    name=st.one_of(st.text("ab", max_size=2), st.text("b", min_size=1), _small, st.just("a" * 9)),
    probe=st.tuples(st.integers(-3, 3), st.text("ab", max_size=2)),
)
@example(tags=[1, None, 2], name="a", probe=(1, "b"))  # another name
@example(tags=[1, 2], name="a", probe=(3, "a"))  # not among the tags
def test_refilter_agrees_with_rows(tags: Any, name: Any, probe: tuple[int, str]) -> None:
    """The query re-filter's shortcut says "produces this row" exactly when the row is
    among the rows the entity produces."""
    from schemaless.entity import Entity
    from schemaless.query import _produces

    entity = Entity({"tags": tags, "name": name}, 1)
    try:
        produced = _REFILTER.rows(entity)
    except InvalidEntity:
        return  # such an entity is never written (put refuses it)
    for row in [*produced, probe]:
        assert _produces(_REFILTER, entity, row) == (row in produced)


def test_value_is_the_one_row_of_a_one_column_index() -> None:
    index = Index("by_n", {"n": "int"})
    for entity in ({"n": 5}, {"n": 2**40}, {"n": None}, {}, {"other": 1}):
        rows = index.rows(entity)
        assert index.value(entity) == (next(iter(rows))[0] if rows else None)
    with pytest.raises(InvalidEntity) as raised:
        index.value({"n": "five"})
    with pytest.raises(InvalidEntity) as by_rows:
        index.rows({"n": "five"})
    assert str(raised.value) == str(by_rows.value)
