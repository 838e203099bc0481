"""What a feed keeps on disk: compressed pages for its inbox and posts tables (the
follow graph's stay as they are: compressed pages cost the hot node's writes), inbox
rows written in their key's order, and the tables of an earlier build (not
compressed) still read and written (docs/feeds.md, "The inbox row's floor")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from schemaless import DataStore, Feeds, new_id
from schemaless import feeds as feeds_module

_COMPRESSION = " ROW_FORMAT=COMPRESSED KEY_BLOCK_SIZE=8"
_TABLES = ("feed__home__inbox", "feed__home__posts")


@pytest.fixture
def ds(make_store: Callable[..., DataStore]) -> DataStore:
    return make_store(changes=True)


def _formats(ds: DataStore) -> dict[str, tuple[str, str]]:
    """(row_format, create_options) of the feed's tables on every server, which agree."""
    topo = ds.cluster.current()
    seen: dict[str, tuple[str, str]] = {}
    for server in ds.cluster.servers():
        rows = server.run(
            "SELECT table_name, row_format, create_options FROM information_schema.tables"
            " WHERE table_schema = %s",
            (topo.owned_db,),
        )[0]
        for name, fmt, options in rows:
            if name in _TABLES:
                assert seen.setdefault(name, (fmt, options)) == (fmt, options)
    return seen


def _exercise(ds: DataStore) -> None:
    """Follow, post (one post updated), fan out, page, unfollow: the answers."""
    feeds = Feeds(ds, "home", backfill=0)
    ann, bob, cat = new_id(), new_id(), new_id()
    assert feeds.follow(ann, bob) and feeds.follow(ann, cat) and feeds.follow(cat, bob)
    posts = [{"text": f"p{i}"} for i in range(6)]
    for i, post in enumerate(posts):
        feeds.post(bob if i % 2 else cat, post)
    ds.put({**(ds.get(posts[1]["id"]) or {}), "text": "edited"})  # a later version
    assert feeds.work(once=True) == 7
    want = [p["id"] for p in posts[::-1]]
    first = feeds.home(ann, limit=4)
    assert first.cursor is not None
    rest = feeds.home(ann, limit=4, cursor=first.cursor)
    assert [e["id"] for e in first] + [e["id"] for e in rest] == want
    assert [e["id"] for e in feeds.posts(bob)] == want[::2]
    assert feeds.graph.count(ann) == 2 and feeds.graph.count_inverse(bob) == 2
    feeds.unfollow(ann, cat)
    assert [e["id"] for e in feeds.home(ann)] == want[::2]


def test_the_feeds_inbox_and_posts_tables_are_compressed(ds: DataStore) -> None:
    _exercise(ds)
    formats = _formats(ds)
    assert sorted(formats) == sorted(_TABLES)
    for name, (fmt, options) in formats.items():
        assert fmt == "Compressed" and "key_block_size=8" in options, name


def test_tables_of_an_earlier_build_keep_their_shape_and_work(
    ds: DataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables made without compression (an earlier build's DDL) are kept as they are by
    a later ``Feeds`` (``CREATE TABLE IF NOT EXISTS``), and read and written alike."""

    def old(make: Callable[[str, str], list[str]]) -> Callable[[str, str], list[str]]:
        return lambda db, name: [s.replace(_COMPRESSION, "") for s in make(db, name)]

    monkeypatch.setattr(feeds_module, "tables_sql", old(feeds_module.tables_sql))
    Feeds(ds, "home")
    monkeypatch.undo()
    Feeds(ds, "home").create()  # this build's DDL: the tables are there
    _exercise(ds)
    assert {fmt for fmt, _ in _formats(ds).values()} == {"Dynamic"}


def test_inbox_rows_are_written_in_their_keys_order(
    ds: DataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round's inbox rows go to each server sorted by (shard, reader, time, post),
    not grouped by author: appended in key order, pages fill (compressed ones most)."""
    parts: list[list[Any]] = []
    batch = feeds_module.Feeds._inbox_batch

    def spy(self: Feeds, part: list[Any]) -> Any:
        parts.append(part)
        return batch(self, part)

    monkeypatch.setattr(feeds_module.Feeds, "_inbox_batch", spy)
    feeds = Feeds(ds, "home", backfill=0)
    readers, authors = [new_id() for _ in range(5)], [new_id() for _ in range(3)]
    for reader in readers:
        for author in authors:
            feeds.follow(reader, author)
    for i in range(9):  # the authors' posts interleaved in time
        feeds.post(authors[i % 3], {"text": f"p{i}"})
    assert feeds.work(once=True) == 9
    rows = [row for part in parts for row in part]
    assert len(rows) == 45 and rows == sorted(rows)
