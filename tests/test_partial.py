"""Partial indexes (``Index(..., where={"kind": "post"})``): definitions, the rows of
matching entities only, moves into and out of the filter at every step of the write
protocol, the re-filter, the Cleaner's backfill and repair by the filter."""

from __future__ import annotations

import random
from typing import Any

import pytest
from conftest import assert_clean, same_store
from test_query import shard_insert

from schemaless import Index, failpoints
from schemaless.cleaner import Cleaner
from schemaless.cleaner.batch import int_column
from schemaless.errors import IndexDefinitionError, UniqueViolation
from schemaless.failpoints import FailpointError
from schemaless.hashing import shard_of
from schemaless.local import LocalCluster

POSTS = Index("posts", {"user": "int", "n": "int"}, where={"kind": "post"})
STEPS = ["put.before_index_rows", "put.after_index_rows", "put.after_entity"]
WATCHED = [*STEPS, "put.after_stale_rows"]  # the last: only when the old body had rows


# -- definitions and rows (no server) ---------------------------------------------------


def test_the_filter_is_part_of_the_definition() -> None:
    assert POSTS.to_dict()["where"] == {"kind": "post"}
    assert Index.from_dict(POSTS.to_dict()) == POSTS
    assert Index("posts", {"user": "int", "n": "int"}) != POSTS
    assert Index("posts", {"user": "int", "n": "int"}, where={"kind": "like"}) != POSTS
    assert "where" not in Index("posts", {"user": "int"}).to_dict()  # old catalogs read same
    nested = Index("x", {"user": "int"}, where={"meta.kind": "post", "draft": False})
    assert Index.from_dict(nested.to_dict()) == nested
    assert int_column(Index("one", {"n": "int"}, where={"kind": "post"})) is None


def test_only_matching_entities_get_rows() -> None:
    assert POSTS.rows({"user": 1, "n": 2, "kind": "post"}) == {(1, 2)}
    for other in ({"kind": "comment"}, {}, {"kind": None}, {"kind": ["post"]}):
        assert POSTS.rows({"user": 1, "n": 2, **other}) == set()
    typed = Index("t", {"user": "int"}, where={"flag": True, "meta.v": 1})
    assert typed.rows({"user": 1, "flag": True, "meta": {"v": 1}}) == {(1,)}
    assert typed.rows({"user": 1, "flag": 1, "meta": {"v": 1}}) == set()  # 1 is not True
    assert typed.rows({"user": 1, "flag": True, "meta": "v"}) == set()  # not a dict: no match
    assert Index("one", {"n": "int"}, where={"k": "a"}).value({"n": 3, "k": "b"}) is None


@pytest.mark.parametrize(
    ("where", "needle"),
    [
        ({}, "must be a non-empty dict"),
        ("kind=post", "must be a non-empty dict"),
        ({"kind": None}, "the value of 'kind' must be a str, int, float or bool"),
        ({"kind": b"post"}, "the value of 'kind' must be"),
        ({"kind": float("nan")}, "the value of 'kind' must be"),
        ({"a..b": 1}, "property path 'a..b' has an empty segment"),
        ({"n": "many"}, "'n'='many' does not fit the index's column int"),
        ({"tags": "x"}, "'tags' is the index's multi property"),
    ],
)
def test_a_bad_filter_is_refused_naming_the_part(where: Any, needle: str) -> None:
    with pytest.raises(IndexDefinitionError, match="where of index 'x'") as exc:
        Index("x", {"n": "int", "tags": "str(8)"}, multi="tags", where=where)
    assert needle in str(exc.value)


# -- against the servers ------------------------------------------------------------------


def _ids(store: Any, user: int) -> list[bytes]:
    return [e["id"] for e in store.iter(POSTS, where={"user": user})]


def test_a_query_returns_only_matching_entities(make_store: Any) -> None:
    store = make_store([POSTS])
    kinds = ["post", "comment", "like", None]
    entities = [{"user": 1, "n": i, "kind": kinds[i % 4]} for i in range(12)]
    store.put_many(entities)
    got = list(store.iter(POSTS, where={"user": 1}))
    assert [e["n"] for e in got] == [0, 4, 8]
    comment = entities[1]
    comment["kind"] = "post"  # into the filter
    store.put(comment)
    entities[0]["kind"] = "draft"  # out of it
    store.put(entities[0])
    assert [e["n"] for e in store.iter(POSTS, where={"user": 1})] == [1, 4, 8]
    store.flush()
    assert_clean(store)


def test_the_refilter_applies_the_filter(make_store: Any) -> None:
    store = make_store([POSTS])
    like = {"user": 1, "n": 1, "kind": "like"}
    store.put(like)
    topo = store.cluster.refresh()
    shard = shard_of(POSTS.shard_key((1, 1)), topo.n_shards)
    columns = ["p_user", "p_n", "entity_id", "entity_version"]
    version = store.get(like["id"]).version  # the row it would produce without the filter
    shard_insert(store, shard, POSTS.table, columns, [1, 1, like["id"], version])
    assert _ids(store, 1) == []


def test_a_redeclaration_with_another_filter_is_refused(make_store: Any) -> None:
    store = make_store([POSTS])
    other = Index("posts", {"user": "int", "n": "int"}, where={"kind": "like"})
    with pytest.raises(IndexDefinitionError, match="different definition"):
        store.declare_index(other)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize(("before", "after"), [("post", "comment"), ("comment", "post")])
def test_moves_across_the_filter_at_every_protocol_step(
    make_store: Any, local_cluster: LocalCluster, step: str, before: str, after: str
) -> None:
    """A put that leaves the filter, and one that enters it, failing at each step and
    watched from another client at each step: a query returns the entity exactly when
    the committed body matches the filter; the Cleaner then leaves the index clean."""
    store = make_store([POSTS])
    entity = {"user": 7, "n": 1, "kind": before}
    store.put(entity)
    watcher = same_store(local_cluster, store)
    seen: list[tuple[str, bool, bool]] = []

    def watch(name: str) -> None:
        stored = watcher.get(entity["id"])
        assert stored is not None
        seen.append((name, stored["kind"] == "post", _ids(watcher, 7) == [entity["id"]]))

    try:
        for name in WATCHED:
            failpoints.set(name, lambda name=name: watch(name))  # type: ignore[misc]
        failpoints.set(step, lambda: (watch(step), failpoints.hit("raise")))
        failpoints.set("raise", "raise")
        with pytest.raises(FailpointError):
            store.put({**entity, "kind": after})
        failpoints.clear()
        assert seen and all(matches == found for _, matches, found in seen), seen
        committed = store.get(entity["id"])
        assert committed is not None
        assert _ids(store, 7) == ([entity["id"]] if committed["kind"] == "post" else [])
        seen.clear()
        for name in WATCHED:
            failpoints.set(name, lambda name=name: watch(name))  # type: ignore[misc]
        store.put({**entity, "kind": after})  # the retry succeeds, watched at every step
        failpoints.clear()
        assert len(seen) >= 3 and all(matches == found for _, matches, found in seen), seen
        assert _ids(store, 7) == ([entity["id"]] if after == "post" else [])
        store.flush()
        Cleaner(store).run_once()
        assert_clean(store)
    finally:
        watcher.close()


def test_backfill_and_repair_go_by_the_filter(make_store: Any) -> None:
    rng = random.Random(3)
    store = make_store()
    docs = [
        {"user": rng.randrange(4), "n": i, "kind": rng.choice(["post", "like", None])}
        for i in range(200)
    ]
    store.put_many(docs)
    store.declare_index(POSTS, force=True)
    assert Cleaner(store).backfill("posts") == "ready"
    assert_clean(store)
    for user in range(4):
        want = sorted(d["n"] for d in docs if d["user"] == user and d["kind"] == "post")
        assert [e["n"] for e in store.iter(POSTS, where={"user": user})] == want
    report = Cleaner(store).run_once()
    assert report is not None
    assert_clean(store)


def test_a_unique_partial_index_is_unique_among_matching_entities(make_store: Any) -> None:
    slugs = Index("slugs", {"slug": "str(20)"}, unique=True, where={"kind": "post"})
    store = make_store([slugs])
    post = {"slug": "hello", "kind": "post"}
    store.put(post)
    store.put({"slug": "hello", "kind": "draft"})  # outside the filter: no claim
    with pytest.raises(UniqueViolation):
        store.put({"slug": "hello", "kind": "post"})
    store.put({**post, "kind": "draft"})  # the post leaves the filter: the value is free
    store.put({"slug": "hello", "kind": "post", "n": 2})
    assert [e.get("n") for e in store.iter(slugs, where={"slug": "hello"})] == [2]
    store.flush()
    assert_clean(store)
