"""The backfill's C path (schemaless.cleaner._rows) against the Python path it skips.

``derive`` sends an index of one int column through ``_rows.int_rows`` first; every
row that path takes must come out exactly as the Python path (``Codec.decode``,
``Index.value``, ``hashing.placer``) would give it, and every row it is unsure of must
be left to Python; ``int_text`` must render a group as ``rows_text`` does.  The oracle
here is the Python path itself: the same batch derived and rendered with the extension
and without it (no database)."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemaless import Index
from schemaless.cleaner import batch as batch_mod
from schemaless.cleaner import sql as sql_mod
from schemaless.cleaner.batch import Derived, Placement, derive, int_column
from schemaless.cleaner.sql import rows_text
from schemaless.codec import Codec, train_dictionary
from schemaless.errors import CorruptEntity, InvalidEntity
from schemaless.hashing import placer
from schemaless.ids import new_id
from schemaless.index import key_encode

BY_N = Index("by_n", {"n": "int"}, shard_on="n")
SHARDS = 16
_rows = batch_mod._rows


def test_the_extension_is_built() -> None:
    # make deps installs gcc and the Python headers (mysqlclient needs them too); an
    # install without them falls back to the Python path, but this project's never.
    assert _rows is not None, "schemaless.cleaner._rows was not built: pip install -e . -v"
    assert int_column(BY_N) == "n"
    assert int_column(Index("f", {"n": "float"})) is None
    assert int_column(Index("t", {"n": "int", "m": "int"})) is None
    assert int_column(Index("m", {"n": "int"}, multi="n")) is None


@given(st.binary(max_size=600))
def test_digest_is_blake2b_of_eight_bytes(data: bytes) -> None:
    expected = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
    assert _rows.digest64(data) == expected


@given(st.integers(-(2**63), 2**63 - 1), st.integers(1, 4096))
def test_place_int_is_the_placement_of_its_key(value: int, n: int) -> None:
    assert _rows.place_int(value, n) == placer(n, key_encode)(value)


def _recover(key: bytes, version: int, body: bytes) -> dict[str, Any]:
    raise CorruptEntity(f"entity {key.hex()} is corrupt")


def _both(codec: Codec, bodies: list[bytes | None]) -> tuple[Derived, Derived, list[int]]:
    """The batch derived with the C path and with Python alone; the rows C left."""
    rows = [(i + 1, new_id(), 5 + i, body) for i, body in enumerate(bodies)]
    fast = derive(BY_N, codec, rows, Placement(SHARDS), _recover)
    left = _rows.int_rows(rows, "n", SHARDS, codec.payload, [[] for _ in range(SHARDS)])
    try:
        batch_mod._rows = None  # type: ignore[assignment]
        slow = derive(BY_N, codec, rows, Placement(SHARDS), _recover)
    finally:
        batch_mod._rows = _rows
    return fast, slow, left


def _same(fast: Derived, slow: Derived) -> None:
    assert fast.targets == slow.targets and fast.rows == slow.rows
    assert [(k, str(e)) for k, e in fast.corrupt] == [(k, str(e)) for k, e in slow.corrupt]
    assert [(k, str(e)) for k, e in fast.unfit] == [(k, str(e)) for k, e in slow.unfit]


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.uuids()
    | st.datetimes(timezones=st.just(UTC))
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
_entities = st.dictionaries(st.sampled_from(["n", "m", "nn", "é", ""]) | st.text(), _values)


def _encodable(entity: dict[str, Any]) -> dict[str, Any] | None:
    try:
        Codec().encode(entity)
    except Exception:
        return None
    return entity


@settings(max_examples=120, deadline=None)  # up to 12 entities each: 18 s at 300
@given(st.lists(_entities.map(_encodable).filter(lambda e: e is not None), max_size=12))
def test_int_rows_agree_with_the_python_path(entities: list[dict[str, Any]]) -> None:
    codec = Codec()
    fast, slow, left = _both(codec, [codec.encode(e) for e in entities])
    _same(fast, slow)
    for i, entity in enumerate(entities):  # C takes every clean int or absent value
        value = entity.get("n")
        if value is None or (type(value) is int and -(2**63) <= value < 2**63):
            assert i not in left


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=8), st.integers(0, 2**32))
def test_damaged_bodies_are_left_to_python(noise: list[bytes], seed: int) -> None:
    codec = Codec()
    good = codec.encode({"id": new_id(), "n": seed, "s": "é" * 3, "u": uuid.uuid4()})
    bodies: list[bytes | None] = [b"\x01\x00" + x for x in noise]
    for i in range(2, len(good)):  # every truncation, and one flipped byte
        bodies.append(good[:i])
    flipped = bytearray(good)
    flipped[seed % len(good)] ^= 0xFF
    bodies += [bytes(flipped), None, good]
    fast, slow, _ = _both(codec, bodies)
    _same(fast, slow)


def _raw(payload: bytes) -> bytes:
    return b"\x01\x00" + payload


def _dt(micros: int, seconds: int) -> bytes:
    return msgpack.packb(msgpack.ExtType(2, struct.pack(">qi", micros, seconds)))


def _map(*pairs: tuple[bytes, bytes]) -> bytes:
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


K = msgpack.packb("n")
OTHER = msgpack.packb("m")
EDGES = {
    "int": (_map((K, msgpack.packb(-7))), True),
    "int64 min": (_map((K, msgpack.packb(-(2**63)))), True),
    "int64 max": (_map((K, msgpack.packb(2**63 - 1))), True),
    "uint64 above": (_map((K, msgpack.packb(2**63))), False),
    "nil": (_map((K, b"\xc0")), True),
    "absent": (_map((OTHER, msgpack.packb(1))), True),
    "bool": (_map((K, b"\xc3")), False),
    "float": (_map((K, msgpack.packb(1.0))), False),
    "duplicate, last wins": (_map((K, msgpack.packb(1)), (K, msgpack.packb(2))), True),
    "duplicate, last not int": (_map((K, msgpack.packb(1)), (K, msgpack.packb("x"))), False),
    "bytes key": (_map((msgpack.packb(b"n"), msgpack.packb(1))), False),
    "int key": (_map((msgpack.packb(3), msgpack.packb(1))), False),
    "bad utf-8 key": (_map((b"\xa2\xc3\x28", msgpack.packb(1)), (K, b"\x01")), False),
    "surrogate": (_map((OTHER, b"\xa3\xed\xa0\x80"), (K, b"\x01")), False),
    "overlong": (_map((OTHER, b"\xa2\xc0\xaf"), (K, b"\x01")), False),
    "4-byte utf-8": (_map((OTHER, msgpack.packb("\U0001f600")), (K, b"\x01")), True),
    "uuid": (_map((OTHER, msgpack.packb(msgpack.ExtType(1, bytes(16)))), (K, b"\x01")), True),
    "short uuid": (
        _map((OTHER, msgpack.packb(msgpack.ExtType(1, bytes(15)))), (K, b"\x01")),
        False,
    ),
    "datetime": (_map((OTHER, _dt(10**15, 3600)), (K, b"\x01")), True),
    "datetime, zone too far": (_map((OTHER, _dt(0, 86400)), (K, b"\x01")), False),
    "datetime, year 10000": (_map((OTHER, _dt(253402300800 * 10**6, 0)), (K, b"\x01")), False),
    "datetime, overflow": (_map((OTHER, _dt(2**63 - 1, 86399)), (K, b"\x01")), False),
    "timestamp ext": (_map((OTHER, b"\xd6\xff\x00\x00\x00\x01"), (K, b"\x01")), False),
    "unknown ext": (_map((OTHER, msgpack.packb(msgpack.ExtType(9, b"x"))), (K, b"\x01")), False),
    "trailing byte": (_map((K, b"\x01")) + b"\x00", False),
    "not a map": (msgpack.packb([1, 2]), False),
    "0xc1": (_map((OTHER, b"\xc1"), (K, b"\x01")), False),
    "deep": (_map((OTHER, b"\x91" * 100 + b"\x01"), (K, b"\x01")), False),
    "nested": (
        _map((OTHER, msgpack.packb({"a": [1, {"n": "x"}], "b": b"\x00"})), (K, b"\x05")),
        True,
    ),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_payloads(name: str) -> None:
    payload, taken = EDGES[name]
    fast, slow, left = _both(Codec(), [_raw(payload)])
    _same(fast, slow)
    assert (left == []) is taken


def test_compressed_bodies_and_a_dictionary() -> None:
    text = "a title of an entity, said again and again; " * 4
    samples = [{"id": new_id(), "title": f"{text}{i}", "n": i} for i in range(300)]
    codec = Codec()
    codec.add_dictionary(7, train_dictionary(samples, 2048))
    plain = [codec.encode(e) for e in samples[:100]]
    codec.use_dictionary(7)
    bodies: list[bytes | None] = plain + [codec.encode(e) for e in samples[100:]]
    assert {b[:2] for b in bodies if b} >= {b"\x01\x01", b"\x01\x02"}
    fast, slow, left = _both(codec, bodies)
    _same(fast, slow)
    assert left == [] and fast.rows == 300
    unknown = Codec()  # a dictionary it does not know: Python's recover() decides
    fast, slow, left = _both(unknown, bodies)
    _same(fast, slow)
    assert len(left) == 200 and len(fast.corrupt) == 200


def test_int_rows_refuses_bad_groups() -> None:
    with pytest.raises(ValueError):
        _rows.int_rows([], "n", 4, Codec().payload, [[], []])
    with pytest.raises(TypeError):
        _rows.int_rows([], "n", 1, Codec().payload, [()])


def test_an_aware_datetime_round_trips_the_range_the_c_path_accepts() -> None:
    codec = Codec()
    zone = timezone(timedelta(hours=23, minutes=59))
    for when in [datetime(1, 1, 2, tzinfo=zone), datetime(9999, 12, 30, tzinfo=zone)]:
        body = codec.encode({"w": when, "n": 1})
        fast, slow, left = _both(codec, [body])
        _same(fast, slow)
        assert left == [] and codec.decode(body)["w"] == when


_text_rows = st.lists(
    st.tuples(st.integers(-(2**63), 2**63 - 1), st.binary(max_size=20), st.integers(0, 2**64 - 1))
)


@given(_text_rows, st.none() | st.integers(0, 65535))
def test_int_text_is_the_python_rendering(
    rows: list[tuple[int, bytes, int]], shard: int | None
) -> None:
    """With or without the owned layout's shard leading each row."""
    render = rows_text(BY_N)
    assert render is not None
    fast = render(rows, shard)
    try:
        sql_mod._rows = None  # type: ignore[assignment]
        assert fast == render(rows, shard) == _rows.int_text(rows, shard)
    finally:
        sql_mod._rows = _rows
    if shard is not None and rows:
        assert fast.startswith(f"({shard},") and fast.count(f"({shard},") == len(rows)


def test_int_text_refuses_what_is_not_a_row() -> None:
    bad_rows = [(1, b"k"), (2**63, b"k", 1), (1, b"k", -1), (1, bytearray(b"k"), 1), (True, b"", 1)]
    for bad in [[row] for row in bad_rows]:
        with pytest.raises((TypeError, OverflowError)):
            _rows.int_text(bad)
    assert _rows.int_text([]) == "" == _rows.int_text([], 3)
    for shard in (-1, 65536, True, 1.0, "1"):
        with pytest.raises((TypeError, ValueError)):
            _rows.int_text([(1, b"k", 2)], shard)


def test_schemaless_no_c_turns_the_c_path_off() -> None:
    code = "from schemaless.cleaner import batch, sql; print(batch._rows is sql._rows is None)"
    for value, off in (("1", "True"), ("0", "False"), ("", "False")):
        env = {**os.environ, "SCHEMALESS_NO_C": value}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == off, done.stderr


_nested = st.dictionaries(
    st.sampled_from(["a", "n", "b"]),
    st.none() | st.integers(-(2**40), 2**40) | _values | st.dictionaries(st.just("n"), _values),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_nested.map(_encodable).filter(lambda e: e is not None), max_size=12))
def test_a_path_index_takes_the_python_path_and_gives_the_rows_writes_give(
    entities: list[dict[str, Any]],
) -> None:
    """A one-int-column index on a path (``a.n``) is not the C path's; its backfill rows
    are each entity's ``index.rows`` (those of a write), and the C path still agrees
    with Python for the top-level ``n`` of the same nested documents."""
    by_path = Index("by_path", {"a.n": "int"})
    assert int_column(by_path) is None and int_column(BY_N) == "n"
    codec = Codec()
    rows = [(i + 1, new_id(), 5 + i, codec.encode(e)) for i, e in enumerate(entities)]
    got = derive(by_path, codec, rows, Placement(SHARDS), _recover)
    place = placer(SHARDS, key_encode)
    want: dict[int, list[tuple[Any, ...]]] = {}
    unfit = []
    for (_, key, version, _), entity in zip(rows, entities, strict=True):
        try:
            for (value,) in by_path.rows(entity):
                want.setdefault(place(value), []).append((value, key, version))
        except InvalidEntity as exc:
            unfit.append((key, str(exc)))
    assert got.targets == {s: sorted(r) for s, r in want.items()}
    assert [(k, str(e)) for k, e in got.unfit] == unfit
    fast, slow, _ = _both(codec, [body for *_, body in rows])
    _same(fast, slow)
