"""Bad input: each case is refused with a typed error that says what and where, nothing
is written on any shard, and the store stays usable.  Bodies planted with raw SQL
(corrupt, truncated, decompression bombs, unknown formats) raise CorruptEntity naming
the entity and its logical shard.  Random entities: whatever put accepts, get returns
equal."""

from __future__ import annotations

import itertools
import math
import os
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import msgpack
import pytest
import zstandard
from conftest import drop_datastore
from faults.helpers import count_rows, open_store, scratch_cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from schemaless import (
    CatalogError,
    CorruptEntity,
    DataStore,
    EntityTooLarge,
    Index,
    IndexDefinitionError,
    InvalidEntity,
    InvalidId,
    InvalidQuery,
    OutcomeUnknown,
    new_id,
)
from schemaless.ids import to_id
from schemaless.local import LocalCluster
from schemaless.names import quote
from schemaless.owned import admin

INDEXES = [
    Index("by_i", {"i": "int"}),
    Index("by_f", {"f": "float"}),
    Index("by_s", {"s": "str(8)"}),
    Index("by_b", {"b": "bytes(4)"}),
    Index("by_u", {"u": "uuid"}),
    Index("by_flag", {"flag": "bool"}),
    Index("by_a", ["a"]),  # untyped: auto
    Index("by_tags", {"tags": "str(8)"}, multi="tags"),
]


def _nested_lists(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _nested_dicts(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"k": value}
    return value


#: (entity without id, error, words the message must contain: what, and where)
BAD: list[tuple[dict[Any, Any], type[Exception], list[str]]] = [
    # not serialisable
    ({"x": object()}, InvalidEntity, ["'x'", "object is not supported"]),
    ({"x": {"y": [1, {1, 2}]}}, InvalidEntity, ["'x'['y'][1]", "set"]),
    ({"x": Decimal("1.5")}, InvalidEntity, ["'x'", "Decimal"]),
    ({"x": date(2009, 2, 26)}, InvalidEntity, ["'x'", "date"]),
    ({"x": (1, 2)}, InvalidEntity, ["'x'", "tuple"]),
    ({"x": bytearray(b"ab")}, InvalidEntity, ["'x'", "bytearray"]),
    ({"x": datetime(2009, 2, 26)}, InvalidEntity, ["'x'", "naive datetime"]),
    ({"x": lambda: 1}, InvalidEntity, ["'x'", "function"]),
    # ints beyond 64 bits
    ({"x": 2**64}, InvalidEntity, ["'x'", "64 bits"]),
    ({"x": -(2**63) - 1}, InvalidEntity, ["'x'", "64 bits"]),
    ({"x": [0, 2**70]}, InvalidEntity, ["'x'[1]", "64 bits"]),
    # keys that are not str
    ({1: "int key"}, InvalidEntity, ["key 1", "must be str"]),
    ({"x": {b"k": 1}}, InvalidEntity, ["'x'", "key b'k'", "must be str"]),
    ({None: 1}, InvalidEntity, ["key None", "must be str"]),
    # NaN / inf
    ({"x": math.nan}, InvalidEntity, ["'x'", "NaN"]),
    ({"f": math.inf}, InvalidEntity, ["'f'", "'by_f'", "inf"]),
    ({"a": -math.inf}, InvalidEntity, ["'a'", "'by_a'", "-inf"]),
    ({"tags": ["ok", math.nan]}, InvalidEntity, ["NaN"]),
    # lone surrogates
    ({"x": "\ud800"}, InvalidEntity, ["'x'", "surrogate"]),
    ({"y": [1, {"z": "a\udfff"}]}, InvalidEntity, ["'y'[1]['z']", "surrogate"]),
    ({"\udc80": 1}, InvalidEntity, ["surrogate"]),
    # too long, or of the wrong type, for the index column
    ({"s": "x" * 9}, InvalidEntity, ["'s'", "'by_s'", "longer than str(8)"]),
    ({"s": 12}, InvalidEntity, ["'s'", "'by_s'", "expected str"]),
    ({"b": b"12345"}, InvalidEntity, ["'b'", "'by_b'", "longer than bytes(4)"]),
    ({"u": b"short"}, InvalidEntity, ["'u'", "'by_u'", "16 bytes"]),
    ({"u": "0123456789abcdef"}, InvalidEntity, ["'u'", "'by_u'", "uuid"]),
    ({"i": "12"}, InvalidEntity, ["'i'", "'by_i'", "expected int"]),
    ({"i": 2**63}, InvalidEntity, ["'i'", "'by_i'", "64-bit"]),
    ({"i": True}, InvalidEntity, ["'i'", "'by_i'", "bool"]),
    ({"flag": 1}, InvalidEntity, ["'flag'", "'by_flag'", "expected bool"]),
    ({"f": 2**53 + 1}, InvalidEntity, ["'f'", "'by_f'", "exactly"]),
    ({"a": "x" * 800}, InvalidEntity, ["'a'", "'by_a'", "767"]),
    ({"a": {"nested": 1}}, InvalidEntity, ["'a'", "'by_a'", "dict"]),
    ({"s": "ab\ud800"}, InvalidEntity, ["surrogate"]),
    # lists where a scalar is indexed, and the reverse
    ({"i": [1, 2]}, InvalidEntity, ["'i'", "'by_i'", "list", "not multi-valued"]),
    ({"tags": "red"}, InvalidEntity, ["'tags'", "'by_tags'", "must be a list"]),
    ({"tags": ["ok", "x" * 9]}, InvalidEntity, ["'tags'", "'by_tags'", "str(8)"]),
    # nesting beyond the limit
    ({"deep": _nested_lists(40)}, InvalidEntity, ["'deep'", "nesting deeper than 32"]),
    ({"deep": _nested_dicts(40)}, InvalidEntity, ["'deep'", "nesting deeper than 32"]),
]


_numbers = itertools.count(1000)


def _case_id(case: tuple[dict[Any, Any], type[Exception], list[str]]) -> str:
    """The entity's repr without object addresses (ids must be the same in every process)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(case[0]))[:40]


@pytest.fixture(scope="module")
def indexed(local_cluster: LocalCluster) -> Iterator[DataStore]:
    """One datastore with an index of every column type (their DDL takes a while)."""
    store = open_store(local_cluster, INDEXES)
    store.put({"id": new_id(), "i": 1, "s": "seed", "tags": ["a"]})
    yield store
    drop_datastore(store)


@pytest.mark.parametrize(("entity", "error", "words"), BAD, ids=[_case_id(c) for c in BAD])
def test_bad_entity_is_refused_and_nothing_is_written(
    indexed: DataStore, entity: dict[Any, Any], error: type[Exception], words: list[str]
) -> None:
    before = count_rows(indexed)
    good = {"id": new_id(), "i": next(_numbers), "s": "good", "tags": ["x", "y"]}
    for attempt in (
        lambda: indexed.put({"id": new_id(), **entity}),
        lambda: indexed.put({**entity}),  # no id: one would be assigned
        lambda: indexed.put({"id": new_id(), **entity}, expect_version=0),
        lambda: indexed.put_many([good, {"id": new_id(), **entity}]),
    ):
        with pytest.raises(error) as info:
            attempt()
        message = str(info.value)
        for word in words:
            assert word in message, f"{word!r} not in {message!r}"
    assert count_rows(indexed) == before  # on every shard: no entity, no index row
    indexed.put(good)  # the store and its connections are still usable
    assert indexed.get(good["id"]) == good
    assert [e.id for e in indexed.query("by_i", i=good["i"])] == [good["id"]]


def test_an_unknown_layout_is_refused_before_anything_is_created(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    prefix = "t_" + uuid.uuid4().hex[:12]
    with pytest.raises(CatalogError, match="layout must be one of owned, databases"):
        DataStore(
            local_cluster.addresses,
            prefix=prefix,
            option_file=str(local_cluster.option_file),
            layout="tables",
        )
    other = make_store()
    for server in other.cluster.all_servers(other.cluster.topology).values():
        sql = "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s"
        assert server.run(sql, (prefix + "\\_%",))[0] == ()


def test_a_bad_entity_in_a_batch_is_named(indexed: DataStore) -> None:
    """Among many entities, the error says which one."""
    bad = new_id()
    batch = [{"id": new_id(), "i": n} for n in range(5)] + [{"id": bad, "i": "x"}]
    with pytest.raises(InvalidEntity) as info:
        indexed.put_many(batch)
    assert bad.hex() in str(info.value)


@pytest.mark.parametrize(
    "bad_id",
    [b"short", b"x" * 17, b"", "0123456789abcdef", "71f0c4d2291844cca2df6f486e96e37c", 12345,
     None, 1.5, bytearray(16), [1] * 16],
    ids=repr,
)  # fmt: skip
def test_ids_that_are_not_16_bytes(indexed: DataStore, bad_id: Any) -> None:
    before = count_rows(indexed)
    calls = [
        lambda: indexed.put({"id": bad_id, "i": 1}),
        lambda: indexed.put_many([{"id": new_id(), "i": 2}, {"id": bad_id, "i": 1}]),
        lambda: indexed.get(bad_id),
        lambda: indexed.get_many([new_id(), bad_id]),
        lambda: indexed.delete(bad_id),
        lambda: indexed.delete_many([bad_id]),
        lambda: indexed.update(bad_id, lambda e: {"i": 1}),
    ]
    for call in calls:
        with pytest.raises(InvalidId) as info:
            call()
        assert "16 bytes" in str(info.value) and type(bad_id).__name__ in str(info.value)
    assert count_rows(indexed) == before


@pytest.mark.parametrize("expect", [-1, "3", 1.0, object()], ids=["-1", "str", "float", "object"])
def test_bad_expect_version(indexed: DataStore, expect: Any) -> None:
    before = count_rows(indexed)
    with pytest.raises(InvalidEntity, match="expect_version"):
        indexed.put({"id": new_id(), "i": 1}, expect_version=expect)
    with pytest.raises(InvalidEntity, match="expect_version"):
        indexed.delete(new_id(), expect_version=expect)
    assert count_rows(indexed) == before


def test_not_a_dict(indexed: DataStore) -> None:
    before = count_rows(indexed)
    for bad in ([("id", new_id())], "entity", None, 42):
        with pytest.raises(InvalidEntity, match="dict"):
            indexed.put(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidEntity, match="dict"):
            indexed.put_many([{"id": new_id()}, bad])  # type: ignore[list-item]
    assert count_rows(indexed) == before


def test_bad_query_values_are_refused(indexed: DataStore) -> None:
    for conditions, words in [
        ({"i": "1"}, ["'i'", "expected int"]),
        ({"i": [1, 2]}, ["'i'", "list"]),
        ({"i": None}, ["None"]),
        ({"f": math.nan}, ["NaN"]),
        ({"nope": 1}, ["'nope'"]),
        ({"i__like": 1}, ["'like'"]),
    ]:
        index = "by_f" if "f" in conditions else "by_i"
        with pytest.raises(InvalidQuery) as info:
            indexed.query(index, **conditions)
        for word in words:
            assert word in str(info.value)
    for cursor in ("garbage", "A" * 20000, "", "eyJ4IjoxfQ"):
        with pytest.raises(InvalidQuery, match="cursor"):
            indexed.query("by_i", i=1, cursor=cursor or "=")


# -- bodies too large -----------------------------------------------------------------


def test_body_above_the_size_limit(make_store: Any) -> None:
    store = make_store(indexes=[INDEXES[0]], max_body_bytes=10_000)
    before = count_rows(store)
    with pytest.raises(EntityTooLarge) as info:
        store.put_many([{"id": new_id(), "i": 1}, {"id": new_id(), "blob": os.urandom(20_000)}])
    assert "10000" in str(info.value) and "above the limit" in str(info.value)
    assert count_rows(store) == before
    default = make_store()
    with pytest.raises(EntityTooLarge):
        default.put({"id": new_id(), "blob": os.urandom(5 * 1024 * 1024)})  # default: 4 MiB
    compressible = {"id": new_id(), "text": "a" * (5 * 1024 * 1024)}
    default.put(compressible)  # the limit is on the encoded body
    assert default.get(compressible["id"]) == compressible


@pytest.fixture(scope="module")
def small_packet() -> Iterator[LocalCluster]:
    """One server whose max_allowed_packet is 1 MiB."""
    config = {"max_allowed_packet": "1M"}
    with scratch_cluster("pkt", servers=1, durable=False, extra_config=config) as cluster:
        yield cluster


def test_body_above_the_servers_max_allowed_packet(small_packet: LocalCluster) -> None:
    store = open_store(small_packet, [INDEXES[0]], max_body_bytes=64 * 1024 * 1024)
    try:
        assert store.codec.max_body_bytes < 1024 * 1024  # lowered to fit the server
        before = count_rows(store)
        with pytest.raises(EntityTooLarge) as info:
            store.put({"id": new_id(), "i": 1, "blob": os.urandom(1_500_000)})
        assert "above the limit" in str(info.value)
        assert count_rows(store) == before

        # A client whose limit is stale (the server's was lowered after it connected):
        # the server refuses the packet and closes the connection.  The client reads
        # its error (EntityTooLarge), or finds the connection closed while still
        # sending, and then cannot know more than OutcomeUnknown.  Not written.
        store.codec.max_body_bytes = 64 * 1024 * 1024
        key = new_id()
        with pytest.raises((EntityTooLarge, OutcomeUnknown)) as info:
            store.put({"id": key, "i": 2, "blob": os.urandom(1_500_000)})
        assert "max_allowed_packet" in str(info.value) or "gone away" in str(info.value)
        assert store.get(key) is None
        assert count_rows(store)["entities"] == before["entities"]
        store.put({"id": key, "i": 2})  # usable
        assert store.get(key) == {"id": key, "i": 2}
    finally:
        drop_datastore(store)


# -- hostile names --------------------------------------------------------------------

HOSTILE = [
    "x`; DROP DATABASE mysql; --",
    "a;b",
    "a--b",
    "a/*b*/",
    "a'b",
    'a"b',
    "a`b",
    "a b",
    "a\\b",
    "a\x00b",
    "a\nb",
    "",
    "1abc",
    "naïve",
    "a" * 65,
    "p_x) VALUES (1",
    "x%sy",
    "x{}y",
]


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_index_refuses_hostile_names(name: str) -> None:
    """Identifiers come only from validated definitions: a name that is not an
    allow-listed identifier is refused, and the message quotes it (repr)."""
    with pytest.raises(IndexDefinitionError) as info:
        Index(name, ["x"])
    assert f"invalid index name {name!r}" in str(info.value)
    with pytest.raises(IndexDefinitionError):
        Index(table="index_" + name, properties=["x"])
    for properties in ([name], {"x": "int", name: "int"}, [(name, "str(8)")], [f"{name}:int"]):
        with pytest.raises(IndexDefinitionError) as info:
            Index("ok", properties)
        assert "property name" in str(info.value) or "type" in str(info.value)
    with pytest.raises(IndexDefinitionError):
        Index("ok", ["x"], shard_on=name)
    with pytest.raises(IndexDefinitionError):
        Index("ok", ["x"], multi=name)
    with pytest.raises(IndexDefinitionError):
        Index("ok", {"x": name})  # not a column type either


def test_reserved_words_are_quoted(make_store: Any) -> None:
    """SQL keywords are valid names: the index works, through every path of the code."""
    index = Index("select", {"select": "int", "from": "str(10)", "where": "int"}, shard_on="from")
    key_words = Index(
        "order",
        {"order": "int", "group": "str(8)", "limit": "float", "key": "bytes(4)", "table": "bool"},
    )
    store = make_store(indexes=[index, key_words])
    entities = [
        {"id": new_id(), "select": n, "from": f"f{n % 2}", "where": -n, "order": n % 3,
         "group": "g", "limit": 1.5, "key": b"k", "table": True}
        for n in range(10)
    ]  # fmt: skip
    store.put_many(entities)
    found = store.query(index, select=4, **{"from": "f0"})
    assert [e["select"] for e in found] == [4]
    got = store.query("select", order="desc", limit=3, select__gte=2)
    assert [e["select"] for e in got] == [9, 8, 7] and got.cursor is not None
    more = store.query("select", order="desc", limit=2, select__gte=2, cursor=got.cursor)
    assert [e["select"] for e in more] == [6, 5]
    zeros = store.query(key_words, **{"order__lte": 0})
    assert sorted(e["select"] for e in zeros) == [0, 3, 6, 9]
    store.put({**entities[0], "select": 100})
    store.delete(entities[1]["id"])
    assert [e["select"] for e in store.iter(index, select__gte=0)][:2] == [2, 3]


def test_a_property_named_like_a_query_parameter_can_be_queried(make_store: Any) -> None:
    """``order`` (or ``limit``, ``cursor``...) is a valid property name, but
    ``query(index, order=3)`` takes 3 for the sort order: such conditions go in
    ``where={...}``; a condition given twice is refused."""
    key_words = Index("order", ["order", "limit"])
    store = make_store(indexes=[key_words])
    key = new_id()
    store.put({"id": key, "order": 3, "limit": 1})
    page = store.query(key_words, where={"order": 3, "limit": 1})
    assert [e.id for e in page] == [key]
    assert [e.id for e in store.iter(key_words, where={"order": 3})] == [key]
    with pytest.raises(InvalidQuery):
        store.query(key_words, where={"limit": 1}, **{"limit__gte": 0, "order": 3})
    for call in (store.query, store.count, store.iter):
        with pytest.raises(InvalidQuery, match="where= takes a mapping"):
            call(key_words, where="order>")  # the CLI's form, not Python's


def test_get_all_with_a_property_named_like_a_query_parameter(make_store: Any) -> None:
    """The FriendFeed form, ``index.get_all(datastore, order=3)``: get_all has no
    parameters of its own, so every keyword is a condition.  Fix (index.py):
    ``return list(datastore.iter(self, where=conditions))`` (and test_index.py's
    FakeStore.iter then receives ``where``)."""
    key_words = Index("order", ["order", "page_size"])
    store = make_store(indexes=[key_words])
    key = new_id()
    store.put({"id": key, "order": 3, "page_size": 1})
    assert [e.id for e in key_words.get_all(store, order=3)] == [key]
    assert [e.id for e in key_words.get_all(store, order=3, page_size=1)] == [key]


# -- corrupt bodies -------------------------------------------------------------------


def _zstd_bomb(declared: int) -> bytes:
    """A small zstd frame that declares ``declared`` bytes of zeros (and holds them)."""
    cobj = zstandard.ZstdCompressor(level=1, write_content_size=True).compressobj(size=declared)
    chunk = b"\0" * (1 << 20)
    parts = [cobj.compress(chunk) for _ in range(declared // len(chunk))]
    return b"".join([*parts, cobj.flush()])


def _corrupt_bodies(store: DataStore) -> dict[str, tuple[bytes, str]]:
    """Planted bodies and a word of the error each must raise."""
    big = {"id": new_id(), "text": "friendfeed " * 200}
    valid = store.codec.encode(big)
    assert valid[:2] == b"\x01\x01"  # zstd
    raw = store.codec.encode({"id": new_id(), "n": 1})
    assert raw[:2] == b"\x01\x00"
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x81\xa1a\x01" * 50)
    return {
        "empty": (b"", "too short"),
        "one byte": (b"\x01", "too short"),
        "unknown version": (b"\x02\x00" + raw[2:], "version 0x02"),
        "version zero": (b"\x00" + valid[1:], "version 0x00"),
        "unknown compression": (b"\x01\x09" + raw[2:], "compression 0x09"),
        "truncated zstd": (valid[: len(valid) // 2], "zstd"),
        "truncated msgpack": (raw[:-2], "msgpack"),
        "trailing bytes": (raw + b"\x00", "msgpack"),
        "garbage frame": (b"\x01\x01" + os.urandom(40), "zstd"),
        "bomb": (b"\x01\x01" + _zstd_bomb(65 * 1024 * 1024), "max_decoded_bytes"),
        "no content size": (b"\x01\x01" + no_size, "content size"),
        "not a map": (b"\x01\x00" + msgpack.packb([1, 2, 3]), "not a map"),
        "unknown extension": (
            b"\x01\x00" + msgpack.packb({"x": msgpack.ExtType(9, b"z")}),
            "extension",
        ),
        "bad uuid extension": (
            b"\x01\x00" + msgpack.packb({"x": msgpack.ExtType(1, b"z")}),
            "uuid",
        ),
        "unknown dictionary": (b"\x01\x02\x00\x00\x03\xe7" + valid[2:], "dictionary"),
        "short dictionary header": (b"\x01\x02\x00", "too short"),
    }


def _plant(store: DataStore, key: bytes, body: bytes) -> int:
    """Overwrite the stored body of entity ``key`` with raw SQL; its logical shard."""
    topo = store.cluster.refresh()
    shard = store.cluster.shard_of_id(key)
    table = quote(topo.dbs[shard], "entities")
    server = store.cluster.server_of_shard(topo, shard)
    server.run(admin([f"UPDATE {table} SET `body` = %s WHERE `id` = %s"]), (body, key))
    return shard


def test_corrupt_bodies_raise_corrupt_entity(make_store: Any) -> None:
    store = make_store(indexes=[INDEXES[0]])
    cases = _corrupt_bodies(store)
    keys = {name: new_id() for name in cases}
    store.put_many([{"id": key, "i": 5} for key in keys.values()])
    good = {"id": new_id(), "i": 5}
    store.put(good)
    for name, (body, word) in cases.items():
        key = keys[name]
        shard = _plant(store, key, body)
        with pytest.raises(CorruptEntity) as info:
            store.get(key)
        message = str(info.value)
        assert key.hex() in message, f"{name}: {message}"
        assert f"logical shard {shard} " in message, f"{name}: {message}"
        assert word in message, f"{name}: {word!r} not in {message!r}"
        with pytest.raises(CorruptEntity):
            store.get_many([good["id"], key])
    with pytest.raises(CorruptEntity):
        store.query("by_i", i=5, limit=100)  # a candidate is corrupt: typed, not a crash
    assert store.get(good["id"]) == good
    # A corrupt entity can be overwritten (blind or over its tombstone) and deleted.
    broken = keys["truncated zstd"]
    version = store.put({"id": broken, "i": 6})
    assert store.get(broken) == {"id": broken, "i": 6} and version > 0
    assert store.delete(keys["bomb"]) is True
    assert store.get(keys["bomb"]) is None


def test_a_partial_query_does_not_hide_a_corrupt_entity(make_store: Any) -> None:
    """``partial=True`` is for unreachable servers.  A corrupt body is not one: it
    raises CorruptEntity as without ``partial``, rather than dropping every match of
    its server and calling the server missing.  Fix: in ``Reader.fetch(partial=True)``
    and ``QueryEngine._scan``, raise the errors of ``fanout_partial`` that are not
    ShardUnavailable."""
    store = make_store(indexes=[INDEXES[0]])
    keys = [new_id() for _ in range(8)]
    store.put_many([{"id": key, "i": 5} for key in keys])
    _plant(store, keys[0], b"\x09\x09")
    with pytest.raises(CorruptEntity):
        store.query("by_i", i=5, partial=True)


# -- random entities ------------------------------------------------------------------

_KEYS = st.text(max_size=12)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40)
    | st.uuids()
    | st.builds(
        lambda dt, minutes: dt.replace(tzinfo=timezone(timedelta(minutes=minutes))),
        st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
        st.integers(min_value=-23 * 60, max_value=23 * 60),
    )
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)
_ENTITIES = st.dictionaries(_KEYS.filter(lambda k: k != "id"), _VALUES, max_size=8)


@pytest.fixture(scope="module")
def random_store(local_cluster: LocalCluster) -> Iterator[DataStore]:
    store = open_store(local_cluster, [Index("by_k", ["k"]), Index("by_t", {"t": "str(16)"})])
    yield store
    drop_datastore(store)


@settings(max_examples=50, deadline=None)
@given(entity=_ENTITIES, k=_SCALARS, t=st.none() | st.text(max_size=20) | _SCALARS)
def test_whatever_put_accepts_get_returns_equal(
    random_store: DataStore, entity: dict[str, Any], k: Any, t: Any
) -> None:
    entity = {**entity, "k": k, "t": t, "id": uuid.uuid4() if len(entity) % 2 else new_id()}
    try:
        random_store.put(entity)
    except InvalidEntity:  # e.g. a value an index cannot hold: nothing written
        assert random_store.get(entity["id"]) is None
        return
    got = random_store.get(entity["id"])
    assert got == entity
    if k is not None:  # accepted, so indexed: the index finds it
        found = random_store.query("by_k", k=k, limit=1000)
        assert to_id(entity["id"]) in [e.id for e in found]


def test_datetimes_come_back_equal(make_store: Any) -> None:
    store = make_store()
    values = [
        datetime(2009, 2, 26, 12, tzinfo=UTC),
        datetime(1, 1, 1, 23, 59, tzinfo=timezone(timedelta(hours=-5))),
        datetime(9999, 12, 31, 0, 0, tzinfo=timezone(timedelta(hours=14))),
    ]
    entity = {"id": new_id(), "when": values}
    store.put(entity)
    assert store.get(entity["id"]) == entity
