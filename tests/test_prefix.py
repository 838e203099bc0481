"""Prefix queries (``prop__startswith``): the range's bound, and the real cluster
checked by a brute-force Python filter."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import drop_datastore

from schemaless import DataStore, Index, InvalidQuery, new_id
from schemaless.local import LocalCluster
from schemaless.query import prefix_end

BY_NAME = Index("by_name", {"name": "str(6)"})
BY_GROUP = Index("by_group", {"group": "int", "name": "str(6)"}, shard_on="group")
BY_RAW = Index("by_raw", {"raw": "bytes(4)"})
BY_N = Index("by_n", {"n": "int"})
BY_AUTO = Index("by_auto", ["a"])
BY_TAGS = Index("by_tags", {"tags": "str(6)"}, multi="tags")

# Boundary characters: LIKE's wildcards and escape, multi-byte, emoji, the last
# characters before and after the surrogates, the last code point.
CHARS = ["a", "b", "%", "_", "\\", " ", "é", "€", "😀", "\ud7ff", "\ue000", "\U0010ffff"]
PREFIXES = ["", "a", "ab", "%", "_", "\\", "a%", "é", "😀", "\ud7ff", "\U0010ffff", "a\U0010ffff"]


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(CHARS) for _ in range(rng.randrange(n + 1)))


# -- the bound ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "end"),
    [
        ("ali", "alj"),
        ("a\U0010ffff", "b"),
        ("a\U0010ffff\U0010ffff", "b"),
        ("\U0010ffff", None),
        ("", None),
        ("\ud7ff", "\ue000"),  # the surrogates are not characters: skipped
        ("😀", "😁"),
        (b"ab", b"ac"),
        (b"a\xff", b"b"),
        (b"\xff\xff", None),
        (b"", None),
    ],
)
def test_prefix_end(prefix: str | bytes, end: str | bytes | None) -> None:
    assert prefix_end(prefix) == end


def test_the_range_holds_exactly_the_values_with_the_prefix() -> None:
    rng = random.Random(40)
    for _ in range(20000):
        value, prefix = random_text(rng, 4), random_text(rng, 2)
        end = prefix_end(prefix)
        in_range = prefix <= value and (end is None or value < end)
        assert in_range == value.startswith(prefix), (value, prefix)
        raw, raw_prefix = rng.randbytes(rng.randrange(4)), rng.randbytes(rng.randrange(2))
        raw_prefix = bytes(b | 0xFE if rng.random() < 0.5 else b for b in raw_prefix)
        raw_end = prefix_end(raw_prefix)
        in_range = raw_prefix <= raw and (raw_end is None or raw < raw_end)
        assert in_range == raw.startswith(raw_prefix), (raw, raw_prefix)


# -- queries ------------------------------------------------------------------------------


def paged(store: DataStore, index: Index, order: str, **conditions: Any) -> list[Any]:
    """Every entity of a query, through the cursor with a small page."""
    out: list[Any] = []
    cursor = None
    while True:
        page = store.query(index, order=order, limit=3, cursor=cursor, **conditions)
        out += page
        cursor = page.cursor
        if cursor is None:
            return out


def check(found: list[Any], expected: list[dict[str, Any]], prop: str, order: str) -> None:
    keys = [(e[prop], e.id) for e in found]
    assert keys == sorted(keys, reverse=order == "desc")
    assert sorted(e.id for e in found) == sorted(e["id"] for e in expected)


@pytest.fixture(scope="module")
def stored(local_cluster: LocalCluster) -> Iterator[tuple[DataStore, list[dict[str, Any]]]]:
    """One datastore for the module: random names, and one equal to each prefix."""
    rng = random.Random(4040)
    store = DataStore(
        local_cluster.addresses,
        [BY_NAME, BY_GROUP, BY_RAW, BY_N, BY_AUTO, BY_TAGS],
        prefix="t_" + uuid.uuid4().hex[:12],
        shards=8,
        option_file=str(local_cluster.option_file),
    )
    entities = [
        {"id": new_id(), "name": random_text(rng, 6), "group": rng.randrange(3)} for _ in range(150)
    ]
    entities += [{"id": new_id(), "name": p, "group": 1} for p in PREFIXES]  # equal to it
    for e in entities:
        e["raw"] = e["name"].encode()[:4]
        e["tags"] = [random_text(rng, 6) for _ in range(rng.randrange(4))]
    store.put_many(entities)
    try:
        yield store, entities
    finally:
        drop_datastore(store)


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_prefix_queries_match_the_brute_force_filter(
    stored: tuple[DataStore, list[dict[str, Any]]], order: str
) -> None:
    store, entities = stored
    for prefix in PREFIXES:
        expected = [e for e in entities if e["name"].startswith(prefix)]
        check(paged(store, BY_NAME, order, name__startswith=prefix), expected, "name", order)
        for group in range(3):  # one shard
            one = [e for e in expected if e["group"] == group]
            found = paged(store, BY_GROUP, order, group=group, name__startswith=prefix)
            check(found, one, "name", order)
        some = [e for e in expected if e["group"] in (0, 2)]
        found = paged(store, BY_GROUP, order, group__in=[2, 0], name__startswith=prefix)
        assert sorted(e.id for e in found) == sorted(e["id"] for e in some)
        tagged = [e for e in entities if any(t.startswith(prefix) for t in e["tags"])]
        found = paged(store, BY_TAGS, order, tags__startswith=prefix)  # each entity once
        assert sorted(e.id for e in found) == sorted(e["id"] for e in tagged)
        raw = prefix.encode()[:4]
        expected = [e for e in entities if e["raw"].startswith(raw)]
        check(paged(store, BY_RAW, order, raw__startswith=raw), expected, "raw", order)


def test_a_cursor_of_a_prefix_query_belongs_to_it(
    stored: tuple[DataStore, list[dict[str, Any]]],
) -> None:
    store, _ = stored
    page = store.query(BY_NAME, name__startswith="a", limit=1)
    assert page.cursor is not None
    with pytest.raises(InvalidQuery, match="another query"):
        store.query(BY_NAME, name__startswith="b", limit=1, cursor=page.cursor)


@pytest.mark.parametrize(
    ("index", "conditions", "needle"),
    [
        (BY_N, {"n__startswith": "1"}, "n__startswith: startswith needs a str"),
        (BY_AUTO, {"a__startswith": "x"}, "'a' of index 'by_auto' is auto"),
        (BY_NAME, {"name__startswith": 1}, "expected str, got int"),
        (BY_RAW, {"raw__startswith": "ab"}, "expected bytes, got str"),
        (BY_NAME, {"name__startswith": "abcdefg"}, "longer than str"),
        (BY_NAME, {"name__startswith": "a", "name__lt": "b"}, "does not combine"),
        (BY_GROUP, {"name__startswith": "a"}, "after the equality prefix"),
        (BY_NAME, {"name": "a", "name__startswith": "a"}, r"\(none: each has an equality\)"),
        (BY_NAME, {"name__startswith": None}, "None"),
    ],
)
def test_bad_prefix_queries_are_refused(
    stored: tuple[DataStore, list[dict[str, Any]]],
    index: Index,
    conditions: dict[str, Any],
    needle: str,
) -> None:
    store, _ = stored
    with pytest.raises(InvalidQuery, match=needle):
        store.query(index, **conditions)
