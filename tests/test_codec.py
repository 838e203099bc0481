"""Unit tests for schemaless.codec: round trips, refusals, corrupt bodies, threads."""

from __future__ import annotations

import contextlib
import enum
import os
import random
import struct
import threading
import tracemalloc
import uuid
from collections import OrderedDict, UserDict, defaultdict
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo

import msgpack
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemaless.codec import MAX_DEPTH, Codec, train_dictionary
from schemaless.errors import CorruptEntity, EntityTooLarge, InvalidEntity

VOCABULARY = [
    "the a of to and in is for on with at by from new how why what this my your",
    "python mysql feed friend photo video blog post comment like share link music",
    "release update review story news today week great first best open source data",
    "server cluster index query shard table entity cleaner storage design talk",
]
WORDS = [word for line in VOCABULARY for word in line.split()]


def feed_entry(rng: random.Random) -> dict[str, Any]:
    """A FriendFeed-like entry: three 16-byte ids, a title, a link, two timestamps."""
    published = 1_700_000_000 + rng.randrange(10**7)
    slug = "-".join(rng.choices(WORDS, k=rng.randint(3, 7)))
    return {
        "id": rng.randbytes(16),
        "user_id": rng.randbytes(16),
        "feed_id": rng.randbytes(16),
        "title": " ".join(rng.choices(WORDS, k=rng.randint(8, 12))).capitalize(),
        "link": f"http://www.{rng.choice(WORDS)}blog.com/2009/{rng.randint(1, 12):02d}/{slug}",
        "published": published,
        "updated": published + rng.choice([0, 0, rng.randrange(5000)]),
    }


@pytest.fixture(scope="module")
def dictionary() -> bytes:
    rng = random.Random(7)
    return train_dictionary([feed_entry(rng) for _ in range(2000)], size=8192)


@pytest.fixture(params=["plain", "dictionary"])
def codec(request: pytest.FixtureRequest, dictionary: bytes) -> Codec:
    codec = Codec()
    if request.param == "dictionary":
        codec.add_dictionary(7, dictionary)
        codec.use_dictionary(7)
    return codec


def roundtrip(codec: Codec, entity: dict[str, Any]) -> dict[str, Any]:
    body = codec.encode(entity)
    assert body[0] == 0x01
    decoded = codec.decode(body)
    assert decoded == entity
    return decoded


def compressible(n: int = 40) -> dict[str, Any]:
    """An entity big and repetitive enough to be stored compressed."""
    return {"tags": [f"tag number {i}" for i in range(n)], "title": "hello " * 20}


# -- round trips ----------------------------------------------------------------------


FIXED_OFFSETS = [
    UTC,
    timezone(timedelta(hours=5, minutes=30)),
    timezone(timedelta(hours=-8)),
    timezone(timedelta(hours=14)),
    timezone(-timedelta(hours=23, minutes=59, seconds=59)),
]

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2**31,
    2**32,
    2**63 - 1,
    2**63,
    2**64 - 1,
    -(2**63),
    0.0,
    -0.0,
    1.5,
    -2.25e-300,
    1e308,
    5e-324,
    float("inf"),
    float("-inf"),
    "",
    "plain ascii",
    "héllo wörld",
    "日本語のテキスト",
    "emoji 🎉👍🏽 and combining é",
    "\x00nul inside\x00",
    "\U0010ffff",
    b"",
    b"\x00\xff" * 8,
    random.Random(16).randbytes(16),
    [],
    {},
    [1, "two", b"three", None, [], {}],
    {"nested": {"deeper": {"list": [1, 2, {"x": None}]}}},
    uuid.UUID(int=random.Random(128).getrandbits(128)),
    uuid.UUID(int=0),
    uuid.UUID(int=2**128 - 1),
    *(datetime(2024, 2, 29, 13, 37, 42, 123456, tzinfo=tz) for tz in FIXED_OFFSETS),
    datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-5))),
    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2024, 7, 1, 12, 0, tzinfo=ZoneInfo("Europe/Paris")),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{type(v).__name__}:{v!r}"[:60])
def test_roundtrip_each_value(codec: Codec, value: Any) -> None:
    decoded = roundtrip(codec, {"v": value, "in_list": [value], "in_map": {"k": value}})
    assert type(decoded["v"]) is type(value)


def test_types_are_preserved(codec: Codec) -> None:
    decoded = roundtrip(
        codec, {"b": True, "i": 1, "f": 1.0, "s": "1", "y": b"1", "u": uuid.UUID(int=1)}
    )
    assert [type(decoded[k]) for k in "bifsyu"] == [bool, int, float, str, bytes, uuid.UUID]


def test_datetime_keeps_instant_and_offset(codec: Codec) -> None:
    tz = timezone(timedelta(hours=-3, minutes=-30))
    value = datetime(2023, 5, 6, 7, 8, 9, 101112, tzinfo=tz)
    decoded = roundtrip(codec, {"when": value})["when"]
    assert decoded.utcoffset() == timedelta(hours=-3, minutes=-30)
    assert decoded.replace(tzinfo=None) == value.replace(tzinfo=None)
    zoned = datetime(2024, 1, 15, 9, 30, tzinfo=ZoneInfo("America/New_York"))
    back = roundtrip(codec, {"when": zoned})["when"]
    assert back.tzinfo == timezone(timedelta(hours=-5))


def test_subclasses_come_back_as_base_types(codec: Codec) -> None:
    class Color(enum.IntEnum):
        RED = 1

    class Name(enum.StrEnum):
        ADA = "ada"

    class MyList(list[int]):
        pass

    entity = {
        "ordered": OrderedDict([("b", 1), ("a", 2)]),
        "default": defaultdict(list, {"x": [1]}),
        "list": MyList([1, 2]),
        "color": Color.RED,
        "name": Name.ADA,
    }
    decoded = roundtrip(codec, entity)
    assert type(decoded["ordered"]) is dict and list(decoded["ordered"]) == ["b", "a"]
    assert type(decoded["default"]) is dict
    assert type(decoded["list"]) is list
    assert type(decoded["color"]) is int and type(decoded["name"]) is str


def test_top_level_mapping_accepted(codec: Codec) -> None:
    proxy = MappingProxyType({"a": 1, "b": [2]})
    assert codec.decode(codec.encode(proxy)) == {"a": 1, "b": [2]}
    assert codec.decode(codec.encode(UserDict({"a": "x"}))) == {"a": "x"}


def test_nesting_up_to_max_depth(codec: Codec) -> None:
    value: Any = "leaf"
    for _ in range(MAX_DEPTH):  # the entity itself is level 1
        value = {"d": value}
    roundtrip(codec, value)
    listed: Any = 1
    for _ in range(MAX_DEPTH - 1):
        listed = [listed]
    roundtrip(codec, {"l": listed})


def test_feed_entries(codec: Codec) -> None:
    rng = random.Random(1)
    for _ in range(200):
        roundtrip(codec, feed_entry(rng))


def test_large_entity(codec: Codec) -> None:
    entity = {"blob": os.urandom(100_000), "text": "lorem ipsum " * 50_000}
    body = codec.encode(entity)
    assert len(body) < 250_000
    assert codec.decode(body) == entity


# -- body format ------------------------------------------------------------------------


def test_small_payload_is_stored_raw() -> None:
    codec = Codec()
    body = codec.encode({"a": 1})
    assert body[:2] == b"\x01\x00"
    assert msgpack.unpackb(body[2:]) == {"a": 1}
    assert codec.dictionary_id(body) is None


def test_compressible_payload_uses_zstd() -> None:
    codec = Codec()
    body = codec.encode(compressible())
    assert body[:2] == b"\x01\x01"
    assert zstandard.frame_content_size(body[2:]) > len(body)
    assert codec.dictionary_id(body) is None


def test_incompressible_payload_falls_back_to_raw() -> None:
    codec = Codec()
    entity = {"blob": os.urandom(500)}
    body = codec.encode(entity)
    assert body[:2] == b"\x01\x00"
    assert codec.decode(body) == entity


def test_payload_that_zstd_barely_shrinks_is_stored_raw() -> None:
    codec = Codec()
    barely = {"blob": os.urandom(400), "text": "a" * 40}  # zstd saves about 8%
    body = codec.encode(barely)
    assert body[:2] == b"\x01\x00"
    assert len(zstandard.ZstdCompressor(level=3).compress(body[2:])) < len(body) - 2
    assert codec.decode(body) == barely
    enough = {"blob": os.urandom(300), "text": "a" * 100}  # about 20%
    assert codec.encode(enough)[:2] == b"\x01\x01"


def test_dictionary_body_names_its_dictionary(dictionary: bytes) -> None:
    codec = Codec()
    codec.add_dictionary(0xDEADBEEF, dictionary)
    codec.use_dictionary(0xDEADBEEF)
    body = codec.encode(feed_entry(random.Random(3)))
    assert body[:6] == b"\x01\x02\xde\xad\xbe\xef"
    assert codec.dictionary_id(body) == 0xDEADBEEF
    params = zstandard.get_frame_parameters(body[6:])
    assert params.dict_id == 0  # the header names it; the frame does not repeat it
    assert params.content_size > 0


def test_dictionary_makes_small_entries_smaller(dictionary: bytes) -> None:
    plain, with_dict = Codec(), Codec()
    with_dict.add_dictionary(1, dictionary)
    with_dict.use_dictionary(1)
    rng = random.Random(5)
    entries = [feed_entry(rng) for _ in range(300)]
    plain_size = sum(len(plain.encode(e)) for e in entries)
    dict_size = sum(len(with_dict.encode(e)) for e in entries)
    assert dict_size < 0.8 * plain_size


def test_switching_dictionaries_keeps_old_bodies_readable(dictionary: bytes) -> None:
    codec = Codec()
    codec.add_dictionary(1, dictionary)
    codec.add_dictionary(2, dictionary[::-1])
    entity = compressible()
    codec.use_dictionary(1)
    first = codec.encode(entity)
    codec.use_dictionary(2)
    second = codec.encode(entity)
    codec.use_dictionary(None)
    third = codec.encode(entity)
    assert [codec.dictionary_id(b) for b in (first, second, third)] == [1, 2, None]
    assert all(codec.decode(b) == entity for b in (first, second, third))


def test_dictionary_management_errors(dictionary: bytes) -> None:
    codec = Codec()
    for bad_id in (0, -1, 2**32, "1", 1.0):
        with pytest.raises(ValueError, match="dictionary id"):
            codec.add_dictionary(bad_id, dictionary)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="8 or more"):
        codec.add_dictionary(3, b"short")
    with pytest.raises(ValueError, match="not usable"):
        codec.add_dictionary(3, b"\x37\xa4\x30\xec" + b"not a real dictionary" * 4)
    codec.add_dictionary(1, dictionary)
    codec.add_dictionary(1, dictionary)  # same data again: fine
    with pytest.raises(ValueError, match="already bound"):
        codec.add_dictionary(1, dictionary + b"x")
    with pytest.raises(ValueError, match="unknown dictionary id 9"):
        codec.use_dictionary(9)
    assert codec.has_dictionary(1) and not codec.has_dictionary(9)
    assert not codec.has_dictionary(3)


def test_train_dictionary_errors() -> None:
    with pytest.raises(ValueError, match="give more samples"):
        train_dictionary([{"a": 1}] * 3)
    with pytest.raises(InvalidEntity, match=r"sample 1: entity property 'x': tuple"):
        train_dictionary([{"x": 1}, {"x": (1,)}])


# -- refusals -------------------------------------------------------------------------


class Custom:
    pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ((1, 2), "tuple would come back as a list; use a list"),
        ({1, 2}, "set is not supported"),
        (frozenset(), "frozenset is not supported"),
        (bytearray(b"x"), "bytearray is not supported; use bytes"),
        (memoryview(b"x"), "memoryview is not supported; use bytes"),
        (Decimal("1.5"), "Decimal is not supported"),
        (date(2024, 1, 1), "date is not supported"),
        (time(12, 0), "time is not supported"),
        (timedelta(seconds=1), "timedelta is not supported"),
        (Custom(), "Custom is not supported"),
        (1j, "complex is not supported"),
        (Fraction(1, 3), "Fraction is not supported"),
        (float("nan"), "NaN is not supported"),
        (2**64, "ints beyond 64 bits"),
        (-(2**63) - 1, "ints beyond 64 bits"),
        (10**40, "ints beyond 64 bits"),
        ("bad \ud800 surrogate", "lone surrogate"),
        (datetime(2024, 1, 1), "naive datetime"),
        (
            datetime(2024, 1, 1, tzinfo=timezone(timedelta(microseconds=1))),
            "not a whole number of seconds",
        ),
    ],
    ids=lambda v: type(v).__name__,
)
def test_refused_values_name_their_path(value: Any, message: str) -> None:
    codec = Codec()
    with pytest.raises(InvalidEntity, match=rf"^entity property 'x': .*{message}") as top:
        codec.encode({"ok": 1, "x": value})
    assert not isinstance(top.value, EntityTooLarge)
    with pytest.raises(InvalidEntity, match=rf"^entity property 'tags'\[3\]: .*{message}"):
        codec.encode({"tags": ["a", "b", "c", value]})
    with pytest.raises(InvalidEntity, match=rf"^entity property 'a'\['b'\]\[0\]: .*{message}"):
        codec.encode({"a": {"b": [value]}})


def test_nan_anywhere_is_refused() -> None:
    codec = Codec()
    with pytest.raises(InvalidEntity, match=r"'m'\['n'\]: NaN"):
        codec.encode({"m": {"n": float("nan")}})
    with pytest.raises(InvalidEntity, match=r"'l'\[0\]: NaN"):
        codec.encode({"l": [float("nan")]})


@pytest.mark.parametrize(
    ("key", "message"),
    [(1, "key 1 is a int"), (b"k", "key b'k' is a bytes"), ((1,), r"key \(1,\) is a tuple")],
)
def test_non_str_keys_are_refused(key: Any, message: str) -> None:
    codec = Codec()
    with pytest.raises(InvalidEntity, match=rf"^entity: {message}; property names must be str"):
        codec.encode({key: 1})
    with pytest.raises(InvalidEntity, match=rf"^entity property 'meta': {message}"):
        codec.encode({"meta": {key: 1}})


def test_surrogate_in_key_is_refused() -> None:
    with pytest.raises(InvalidEntity, match=r"entity property 'm'\['\\ud800'\]: .*surrogate"):
        Codec().encode({"m": {"\ud800": 1}})


def test_non_mapping_entities_are_refused() -> None:
    codec = Codec()
    for value in ([("a", 1)], None, "a", 1, b"x"):
        with pytest.raises(InvalidEntity, match="an entity must be a dict"):
            codec.encode(value)  # type: ignore[arg-type]


def test_too_deep_is_refused() -> None:
    value: Any = "leaf"
    for _ in range(MAX_DEPTH + 1):
        value = {"d": value}
    with pytest.raises(InvalidEntity, match=f"nesting deeper than {MAX_DEPTH}"):
        Codec().encode(value)
    listed: Any = 1
    for _ in range(MAX_DEPTH):
        listed = [listed]
    with pytest.raises(InvalidEntity, match=rf"'l'(\[0\]){{{MAX_DEPTH - 1}}}: nesting deeper"):
        Codec().encode({"l": listed})
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(InvalidEntity, match=r"^entity property 'c'\[0\]\[0\].*nesting deeper"):
        Codec().encode({"c": cyclic})


def test_messages_never_embed_huge_values() -> None:
    huge_key = "k" * 10_000
    with pytest.raises(InvalidEntity) as info:
        Codec().encode({huge_key: (1,)})
    assert len(str(info.value)) < 200
    with pytest.raises(InvalidEntity) as info:
        Codec().encode({"m": {b"x" * 10_000: 1}})
    assert len(str(info.value)) < 200


def test_body_over_limit_is_refused() -> None:
    codec = Codec(max_body_bytes=1000)
    codec.encode({"blob": os.urandom(900)})
    with pytest.raises(EntityTooLarge, match=r"body is 1\d{3} bytes encoded, above .* 1000 bytes"):
        codec.encode({"blob": os.urandom(1100)})
    codec.max_body_bytes = 500  # the cluster lowers it to max_allowed_packet
    with pytest.raises(EntityTooLarge, match="above the limit of 500 bytes"):
        codec.encode({"blob": os.urandom(600)})
    assert issubclass(EntityTooLarge, InvalidEntity)


def test_payload_over_decoded_limit_is_refused_on_encode() -> None:
    codec = Codec(max_decoded_bytes=10_000)
    with pytest.raises(EntityTooLarge, match="max_decoded_bytes 10000"):
        codec.encode({"text": "a" * 20_000})  # compresses well, but could not be decoded


# -- corrupt bodies ---------------------------------------------------------------------


def raw_body(obj: Any) -> bytes:
    payload: bytes = msgpack.packb(obj, use_bin_type=True)
    return b"\x01\x00" + payload


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "too short for a header"),
        (b"\x01", "too short for a header"),
        (b"\x02\x00\x80", "unknown body format version 0x02"),
        (b"\x00\x00\x80", "unknown body format version 0x00"),
        (b"\x01\x03\x80", "unknown compression 0x03"),
        (b"\x01\xff\x80", "unknown compression 0xff"),
        (b"\x01\x02\x00\x00", "too short for a dictionary id"),
        (b"\x01\x02\x00\x00\x00\x09" + b"\x00" * 20, "unknown dictionary id 9"),
        (b"\x01\x01", "invalid zstd frame header"),
        (b"\x01\x01garbage!garbage!", "invalid zstd frame header"),
        (b"\x01\x00", "invalid msgpack payload"),
        (b"\x01\x00\xc1", "invalid msgpack payload"),
        (b"\x01\x00\x92\x01", "invalid msgpack payload"),
        (raw_body({"a": 1}) + b"\x00", "invalid msgpack payload: ExtraData"),
        (raw_body([1, 2]), "payload is a list, not a map"),
        (raw_body("text"), "payload is a str, not a map"),
        (raw_body({1: 2}), "invalid msgpack payload"),
        (b"\x01\x00\x81\xa1a\xa2\xff\xfe", "invalid msgpack payload: UnicodeDecodeError"),
        (raw_body({"x": msgpack.ExtType(9, b"")}), "unknown msgpack extension type 9"),
        (raw_body({"x": msgpack.ExtType(1, b"short")}), "uuid extension of 5 bytes"),
        (raw_body({"x": msgpack.ExtType(2, b"\x00" * 8)}), "datetime extension of 8 bytes"),
        (
            raw_body({"x": msgpack.ExtType(2, struct.pack(">qi", 0, 90_000))}),
            "datetime extension out of range",
        ),
        (
            raw_body({"x": msgpack.ExtType(2, struct.pack(">qi", 2**62, 0))}),
            "datetime extension out of range",
        ),
    ],
)
def test_corrupt_bodies(body: bytes, message: str) -> None:
    with pytest.raises(CorruptEntity, match=message):
        Codec().decode(body)


def test_dictionary_id_of_bad_bodies() -> None:
    codec = Codec()
    for body in (b"", b"\x05\x00", b"\x01\x07", b"\x01\x02\x00"):
        with pytest.raises(CorruptEntity):
            codec.dictionary_id(body)


def test_unknown_dictionary_is_named(dictionary: bytes) -> None:
    writer, reader = Codec(), Codec()
    writer.add_dictionary(4242, dictionary)
    writer.use_dictionary(4242)
    body = writer.encode(feed_entry(random.Random(9)))
    with pytest.raises(CorruptEntity, match="unknown dictionary id 4242"):
        reader.decode(body)
    assert reader.dictionary_id(body) == 4242
    reader.add_dictionary(4242, dictionary)  # what a client does after a catalog refresh
    assert reader.decode(body) == writer.decode(body)


def test_msgpack_timestamp_extension_decodes_as_utc_datetime() -> None:
    body = raw_body({"t": msgpack.Timestamp(1_700_000_000, 5000)})
    assert Codec().decode(body) == {"t": datetime(2023, 11, 14, 22, 13, 20, 5, tzinfo=UTC)}


def bodies_for_fuzzing(dictionary: bytes) -> list[tuple[Codec, bytes]]:
    plain, with_dict = Codec(), Codec()
    with_dict.add_dictionary(3, dictionary)
    with_dict.use_dictionary(3)
    entry = feed_entry(random.Random(11))
    small = {"u": uuid.UUID(int=5), "t": datetime(2020, 1, 1, tzinfo=UTC)}
    bodies = [
        (plain, plain.encode(small)),
        (plain, plain.encode(compressible(8))),
        (with_dict, with_dict.encode(entry)),
    ]
    assert [b[1] for _, b in bodies] == [0, 1, 2]
    return bodies


def test_every_truncation_is_corrupt(dictionary: bytes) -> None:
    for codec, body in bodies_for_fuzzing(dictionary):
        for end in range(len(body)):
            with pytest.raises(CorruptEntity):
                codec.decode(body[:end])


def test_trailing_data_is_corrupt(dictionary: bytes) -> None:
    for codec, body in bodies_for_fuzzing(dictionary):
        for extra in (b"\x00", b"junk", body[2:]):
            with pytest.raises(CorruptEntity):
                codec.decode(body + extra)


def test_bit_flips_never_escape_as_other_errors(dictionary: bytes) -> None:
    for codec, body in bodies_for_fuzzing(dictionary):
        detected = 0
        for bit in range(len(body) * 8):
            flipped = bytearray(body)
            flipped[bit // 8] ^= 1 << (bit % 8)
            try:
                decoded = codec.decode(bytes(flipped))
            except CorruptEntity:
                detected += 1
            else:
                assert isinstance(decoded, dict)
        assert detected >= 16  # at least every header bit


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([b"\x01\x00", b"\x01\x01", b"\x01\x02"]))
def test_random_bytes_only_raise_corrupt_entity(tail: bytes, head: bytes) -> None:
    with contextlib.suppress(CorruptEntity):
        assert isinstance(Codec().decode(head + tail), dict)


# -- decompression bombs -----------------------------------------------------------------


def test_frame_declaring_huge_content_is_refused_before_decompressing() -> None:
    # magic, descriptor (8-byte content size, single segment), 1 TiB, an empty raw block
    frame = b"\x28\xb5\x2f\xfd" + b"\xe0" + (2**40).to_bytes(8, "little") + b"\x01\x00\x00"
    assert zstandard.frame_content_size(frame) == 2**40
    with pytest.raises(CorruptEntity, match=r"declares 1099511627776 bytes of content"):
        Codec().decode(b"\x01\x01" + frame)


def test_real_bomb_is_refused_without_allocating() -> None:
    frame = zstandard.ZstdCompressor(level=3).compress(b"\x00" * (32 * 1024 * 1024))
    assert len(frame) < 4096
    codec = Codec(max_decoded_bytes=1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptEntity, match="above max_decoded_bytes 1048576"):
            codec.decode(b"\x01\x01" + frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024


def test_frame_without_content_size_is_refused() -> None:
    payload = msgpack.packb({"a": "x" * 100})
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(payload)
    with pytest.raises(CorruptEntity, match="does not declare its content size"):
        Codec().decode(b"\x01\x01" + frame)
    compressor = zstandard.ZstdCompressor().compressobj()
    streamed = compressor.compress(payload) + compressor.flush()
    with pytest.raises(CorruptEntity, match="does not declare its content size"):
        Codec().decode(b"\x01\x01" + streamed)


def test_frame_lying_about_its_size_is_corrupt() -> None:
    payload = msgpack.packb({"a": "x" * 100})
    frame = bytearray(zstandard.ZstdCompressor().compress(payload))
    header = zstandard.get_frame_parameters(bytes(frame))
    assert header.content_size == len(payload)
    size_at = 5  # single-segment frame: the 1-byte content size follows the descriptor
    assert frame[size_at] == len(payload)
    for wrong in (len(payload) - 1, len(payload) + 1):
        frame[size_at] = wrong
        with pytest.raises(CorruptEntity):
            Codec().decode(b"\x01\x01" + bytes(frame))


def test_two_frames_are_corrupt() -> None:
    frame = zstandard.ZstdCompressor().compress(msgpack.packb({"a": "x" * 100}))
    with pytest.raises(CorruptEntity, match="corrupt zstd frame"):
        Codec().decode(b"\x01\x01" + frame + frame)


# -- property tests ---------------------------------------------------------------------


offsets = st.integers(-86399, 86399).map(lambda s: timezone(timedelta(seconds=s)))
aware_datetimes = st.datetimes(timezones=offsets)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(max_size=64)
    | st.uuids()
    | aware_datetimes
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=15,
)
entities = st.dictionaries(st.text(max_size=12), values, max_size=8)


@pytest.fixture(scope="module")
def both_codecs(dictionary: bytes) -> tuple[Codec, Codec]:
    with_dict = Codec()
    with_dict.add_dictionary(1, dictionary)
    with_dict.use_dictionary(1)
    return Codec(), with_dict


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entity=entities)
def test_property_roundtrip(entity: dict[str, Any], both_codecs: tuple[Codec, Codec]) -> None:
    for codec in both_codecs:
        assert codec.decode(codec.encode(entity)) == entity


anything = st.recursive(
    scalars
    | st.integers()
    | st.floats()
    | st.text(st.characters(exclude_categories=()))  # with lone surrogates
    | st.datetimes()
    | st.dates()
    | st.decimals(allow_nan=False)
    | st.binary(max_size=8).map(bytearray),
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=4) | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entity=st.dictionaries(st.text(max_size=6), anything, max_size=6))
def test_whatever_encode_accepts_decodes_equal(entity: dict[str, Any]) -> None:
    codec = Codec()
    try:
        body = codec.encode(entity)
    except InvalidEntity as exc:
        assert str(exc).startswith("entity")
    else:
        assert codec.decode(body) == entity


# -- threads --------------------------------------------------------------------------


def test_threads_share_one_codec(dictionary: bytes) -> None:
    codec = Codec()
    codec.add_dictionary(1, dictionary)
    n_threads, rounds = 8, 150
    barrier = threading.Barrier(n_threads)
    failures: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        entries = [feed_entry(rng) | {"seed": seed, "n": i} for i in range(rounds)]
        entries += [compressible(rng.randint(5, 50)) | {"seed": seed} for _ in range(20)]
        try:
            barrier.wait()
            for entry in entries:
                body = codec.encode(entry)
                assert codec.decode(body) == entry
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(n_threads)]
    for thread in threads:
        thread.start()
    for _ in range(20):  # switch dictionaries while the workers run
        codec.use_dictionary(1)
        codec.use_dictionary(None)
    for thread in threads:
        thread.join()
    assert not failures
