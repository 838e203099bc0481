"""Index properties that are paths into nested documents (``author.id``, ``tags.name``):
definitions, rows, queries and their re-filter, backfill, and an oracle on SQLite's
JSON functions over random nested documents."""

from __future__ import annotations

import json
import random
import sqlite3
from typing import Any

import pytest
from conftest import assert_clean
from test_query import shard_insert

from schemaless import Index
from schemaless.cleaner import Cleaner
from schemaless.errors import IndexDefinitionError, InvalidEntity, InvalidQuery
from schemaless.hashing import shard_of

BY_AUTHOR = Index("by_author", {"author.id": "int", "published": "int"})
BY_TAG_NAME = Index("by_tag_name", {"tags.name": "str(16)"}, multi="tags.name")
POSTS_BY_AUTHOR = Index(
    "posts_by_author", {"author.id": "int"}, where={"kind": "post", "meta.lang": "en"}
)


# -- definitions and rows (no server) ---------------------------------------------------


def test_a_path_gets_a_safe_column_and_round_trips_through_the_catalog() -> None:
    assert BY_AUTHOR.columns == ("p_author__id", "p_published")
    assert BY_AUTHOR.shard_on == "author.id"
    assert Index.from_dict(json.loads(json.dumps(BY_AUTHOR.to_dict()))) == BY_AUTHOR
    assert Index.from_dict(BY_TAG_NAME.to_dict()) == BY_TAG_NAME
    old = {"name": "by_user", "properties": [["user_id", "uuid"]], "shard_on": None, "multi": None}
    assert Index.from_dict(old).columns == ("p_user_id",)  # an old definition: unchanged


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("a..b", "'a..b' has an empty segment"),
        (".a", "'.a' has an empty segment"),
        ("a.", "'a.' has an empty segment"),
        ("a.1b", "segment '1b' of property path 'a.1b' is not a name"),
        ("a.b-c", "segment 'b-c' of property path 'a.b-c'"),
        ("a." + "b" * 62, "would be above 64 characters"),
    ],
)
def test_bad_paths_are_refused_naming_the_part(path: str, needle: str) -> None:
    with pytest.raises(IndexDefinitionError, match="index 'x'") as exc:
        Index("x", [path])
    assert needle in str(exc.value)


def test_a_path_and_a_name_that_would_share_a_column_are_refused() -> None:
    with pytest.raises(IndexDefinitionError, match="would share the column 'p_a__b'"):
        Index("x", ["a.b", "a__b"])


def test_rows_follow_the_path() -> None:
    assert BY_AUTHOR.rows({"author": {"id": 3, "name": "al"}, "published": 5}) == {(3, 5)}
    for missing in ({"published": 5}, {"author": None, "published": 5}, {"author": {}}):
        assert BY_AUTHOR.rows(missing) == set()
    body = {"tags": [{"name": "a"}, {"name": "b"}, {}, None, {"name": ["c", "a"]}]}
    assert BY_TAG_NAME.rows(body) == {("a",), ("b",), ("c",)}
    assert BY_TAG_NAME.rows({"tags": {"name": ["x"]}}) == {("x",)}  # no list crossed
    assert BY_TAG_NAME.rows({"tags": []}) == set()
    one = Index("one", {"author.id": "int"})
    assert one.value({"author": {"id": 7}}) == 7 and one.value({"author": {}}) is None


@pytest.mark.parametrize(
    ("index", "entity", "needle"),
    [
        (BY_AUTHOR, {"author": "bob", "published": 1}, "before 'id' is not a dict (got str)"),
        (BY_AUTHOR, {"author": [{"id": 1}], "published": 1}, "goes through a list before 'id'"),
        (BY_AUTHOR, {"author": {"id": [1]}, "published": 1}, "is a list, but the index"),
        (BY_AUTHOR, {"author": {"id": "x"}, "published": 1}, "'author.id'"),
        (BY_TAG_NAME, {"tags": [1]}, "before 'name' is not a dict (got int)"),
        (BY_TAG_NAME, {"tags": {"name": "x"}}, "must be a list, got str"),
    ],
)
def test_a_value_the_path_cannot_index_is_refused(
    index: Index, entity: dict[str, Any], needle: str
) -> None:
    with pytest.raises(InvalidEntity, match=f"property '[a-z.]+' of index '{index.name}'") as exc:
        index.rows(entity)
    assert needle in str(exc.value)


# -- against the servers ------------------------------------------------------------------


def test_query_by_path_with_ranges_and_multi(make_store: Any) -> None:
    store = make_store([BY_AUTHOR, BY_TAG_NAME])
    posts = [
        {"author": {"id": i % 3, "name": f"n{i}"}, "published": i, "tags": [{"name": f"t{i % 2}"}]}
        for i in range(12)
    ]
    store.put_many(posts)
    got = store.query("by_author", where={"author.id": 1, "published__gte": 4})
    assert [e["published"] for e in got] == [4, 7, 10]
    assert [e["published"] for e in store.iter(BY_AUTHOR, where={"author.id": 2})] == [2, 5, 8, 11]
    tagged = BY_TAG_NAME.get_all(store, **{"tags.name": "t1"})
    assert sorted(e["published"] for e in tagged) == [1, 3, 5, 7, 9, 11]
    with pytest.raises(InvalidQuery, match="has no property 'author'"):
        store.query("by_author", where={"author": 1})


def test_a_put_the_path_cannot_index_writes_nothing(make_store: Any) -> None:
    store = make_store([BY_AUTHOR])
    entity = {"author": "bob", "published": 1}
    with pytest.raises(InvalidEntity, match=r"'author\.id' of index 'by_author'"):
        store.put(entity)
    assert "id" not in entity or store.get(entity["id"]) is None
    assert list(store.iter(BY_AUTHOR, where={"author.id__gte": 0})) == []
    assert_clean(store)


def test_the_refilter_checks_the_stored_entity_by_the_path(make_store: Any) -> None:
    store = make_store([BY_AUTHOR])
    entity = {"author": {"id": 1}, "published": 1}
    store.put(entity)
    topo = store.cluster.refresh()
    values = (2, 1)  # a row the stored body does not produce (a stale one)
    shard = shard_of(BY_AUTHOR.shard_key(values), topo.n_shards)
    columns = ["p_author__id", "p_published", "entity_id", "entity_version"]
    shard_insert(store, shard, BY_AUTHOR.table, columns, [*values, entity["id"], 1])
    assert list(store.iter(BY_AUTHOR, where={"author.id": 2})) == []
    assert [e["id"] for e in store.iter(BY_AUTHOR, where={"author.id": 1})] == [entity["id"]]


def _documents(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Random nested documents: authors present, absent or null, lists of tags."""
    out = []
    for _ in range(n):
        doc: dict[str, Any] = {"published": rng.randrange(50)}
        doc["kind"] = rng.choice(["post", "post", "comment", None])
        doc["meta"] = rng.choice([{"lang": "en"}, {"lang": "en"}, {"lang": "fr"}, "en", {}])
        pick = rng.random()
        if pick < 0.7:
            doc["author"] = {"id": rng.randrange(6), "name": rng.choice("abc")}
        elif pick < 0.8:
            doc["author"] = {"name": "anon"}
        elif pick < 0.9:
            doc["author"] = None
        tags = [{"name": rng.choice(["x", "y", "z"])} for _ in range(rng.randrange(3))]
        if rng.random() < 0.2:
            tags.append({"other": 1})
        doc["tags"] = tags
        out.append(doc)
    return out


def _oracle(docs: dict[bytes, dict[str, Any]]) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE docs (id BLOB PRIMARY KEY, body TEXT)")
    db.executemany(
        "INSERT INTO docs VALUES (?, ?)",
        [(k, json.dumps({p: v for p, v in d.items() if p != "id"})) for k, d in docs.items()],
    )
    return db


def test_path_queries_agree_with_sqlite_json_on_random_documents(make_store: Any) -> None:
    """Random puts, updates (moving documents into and out of the partial filter) and
    deletes; every query through a path index, partial or not, returns what SQLite's
    json_extract / json_each find in the same documents, before and after a Cleaner
    pass (which finds nothing to repair)."""
    rng = random.Random(40)
    store = make_store([BY_AUTHOR, BY_TAG_NAME, POSTS_BY_AUTHOR])
    docs: dict[bytes, dict[str, Any]] = {}
    batch = _documents(rng, 120)
    store.put_many(batch)
    docs.update({d["id"]: d for d in batch})
    for _ in range(80):
        key = rng.choice(sorted(docs))
        if rng.random() < 0.25:
            store.delete(key)
            del docs[key]
        else:
            fresh = {**_documents(rng, 1)[0], "id": key}
            store.put(fresh)
            docs[key] = fresh

    def check() -> None:
        db = _oracle(docs)
        for author in range(6):
            want = db.execute(
                "SELECT id FROM docs WHERE json_extract(body, '$.author.id') = ?"
                " AND json_extract(body, '$.published') >= 20 ORDER BY json_extract(body,"
                " '$.published'), id",
                [author],
            ).fetchall()
            got = store.iter(BY_AUTHOR, where={"author.id": author, "published__gte": 20})
            assert [e["id"] for e in got] == [k for (k,) in want]
            want = db.execute(
                "SELECT id FROM docs WHERE json_extract(body, '$.author.id') = ? AND"
                " json_extract(body, '$.kind') = 'post' AND json_type(body, '$.meta') ="
                " 'object' AND json_extract(body, '$.meta.lang') = 'en' ORDER BY id",
                [author],
            ).fetchall()
            got = store.iter(POSTS_BY_AUTHOR, where={"author.id": author})
            assert [e["id"] for e in got] == [k for (k,) in want]
        for tag in "xyz":
            want = db.execute(
                "SELECT DISTINCT docs.id FROM docs, json_each(body, '$.tags') AS t"
                " WHERE json_extract(t.value, '$.name') = ?",
                [tag],
            ).fetchall()
            got = store.iter(BY_TAG_NAME, where={"tags.name": tag})
            assert sorted(e["id"] for e in got) == sorted(k for (k,) in want)

    check()
    Cleaner(store).run_once()
    assert_clean(store)
    check()


def test_a_path_index_backfills_the_rows_writes_give(make_store: Any) -> None:
    rng = random.Random(7)
    docs = _documents(rng, 300)
    written = make_store([BY_AUTHOR, BY_TAG_NAME, POSTS_BY_AUTHOR])
    written.put_many([dict(d) for d in docs])
    later = make_store()
    later.put_many([dict(d) for d in docs])
    for index in (BY_AUTHOR, BY_TAG_NAME, POSTS_BY_AUTHOR):
        later.declare_index(index, force=True)
        assert Cleaner(later).backfill(index.name) == "ready"
    assert_clean(later)
    assert_clean(written)
    for author in range(6):
        got = [
            sorted(
                (e["published"], e["author"]["name"])
                for e in s.iter(BY_AUTHOR, where={"author.id": author})
            )
            for s in (written, later)
        ]
        assert got[0] == got[1] and got[0]
    posts = [
        sorted(e["published"] for e in s.iter(POSTS_BY_AUTHOR, where={"author.id__gte": 0}))
        for s in (written, later)
    ]
    assert posts[0] == posts[1] and posts[0]
    for tag in "xyz":
        counts = [
            len(list(s.iter(BY_TAG_NAME, where={"tags.name": tag}))) for s in (written, later)
        ]
        assert counts[0] == counts[1] > 0
