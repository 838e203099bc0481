"""Reads in the owned layout take only the logical shards of the map: rows a move
copied into a server before its flip are never returned, rows it left behind after
its fence fail the read (TableMissing), never silently; and the layout of a database
per logical shard still answers the same reads."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from schemaless import DataStore, Index, IndexDoesNotFit, TableMissing, new_id, owned
from schemaless.hashing import shard_of
from schemaless.names import quote
from schemaless.owned import UNCHECKED, admin, among, copying

BY_N = Index("by_n", {"n": "int"})  # placed by n: a range over n scatters


def _value_on(store: DataStore, shard: int) -> int:
    """A value of ``n`` whose index rows live on ``shard``."""
    n_shards = store.cluster.topology.n_shards
    return next(v for v in range(1000) if shard_of(BY_N.shard_key((v,)), n_shards) == shard)


def _id_on(store: DataStore, shard: int) -> bytes:
    """A new entity id of ``shard``."""
    while store.cluster.shard_of_id(key := new_id()) != shard:
        pass
    return key


def _copy_in(store: DataStore, sid: int, shard: int, stmts: list[str], params: list[Any]) -> None:
    """Rows of ``shard`` written into server ``sid``, which does not hold it, as a
    move's copy writes them before its flip."""
    server = store.cluster.all_servers(store.cluster.topology)[sid]
    server.run(admin(copying(shard, stmts)), params)


@contextmanager
def _fenced(store: DataStore, shard: int) -> Iterator[None]:
    """Inside: ``shard``'s ``owned`` row deleted from its server, as by a move's fence
    (its rows are still there, left behind); put back after."""
    topo = store.cluster.topology
    assert topo.owned_db is not None
    owned, server = quote(topo.owned_db, "owned"), store.cluster.server_of_shard(topo, shard)
    server.run(admin([f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {int(shard)}"]))
    try:
        yield
    finally:
        server.run(admin([f"INSERT INTO {owned} (`shard`) VALUES ({int(shard)})"]))


@pytest.fixture(params=["listed", "owned"])
def scan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A scatter's parts name the server's shards of the map, or (as above
    ``OWNED_LIST_MAX`` shards a server) take those its ``owned`` table names, and the
    checks (as above ``LISTED_MAX``) read the digest first."""
    if request.param == "owned":
        monkeypatch.setattr("schemaless.query.OWNED_LIST_MAX", 0)
        monkeypatch.setattr(owned, "LISTED_MAX", 0)
        owned._check.cache_clear()
    yield str(request.param)
    owned._check.cache_clear()


def _digests(store: DataStore) -> dict[int, tuple[int, int, int]]:
    """Each server's ``owned_digest`` row."""
    topo = store.cluster.topology
    table = quote(str(topo.owned_db), "owned_digest")
    out = {}
    for sid, server in store.cluster.all_servers(topo).items():
        rows = server.run(admin([f"SELECT `n`, `d0`, `d1` FROM {table}"]))[0]
        assert len(rows) == 1
        out[sid] = tuple(int(v) for v in rows[0])
    return out


def test_the_digest_follows_every_change_of_the_owned_rows(make_store: Any) -> None:
    """The triggers keep each server's digest equal to the Python digest of the set it
    owns: after init, after a fence deletes a row, after the row comes back; an
    ``owned`` row is never updated."""
    store = make_store([BY_N])
    topo = store.cluster.topology
    placed = topo.placed
    assert _digests(store) == {sid: owned.digest(placed[sid]) for sid in topo.servers}
    shard = placed[0][1]
    key = _id_on(store, placed[0][0])
    store.put({"id": key, "n": 1})
    with _fenced(store, shard):
        left = tuple(s for s in placed[0] if s != shard)
        assert _digests(store)[0] == owned.digest(left) != owned.digest(placed[0])
        with pytest.raises(TableMissing):  # get_many's join: the digest differs, the count fails
            store.get_many([_id_on(store, shard)])
        assert store.get_many([key]) == [{"id": key, "n": 1}]  # the digest differs: counted
    assert _digests(store)[0] == owned.digest(placed[0])
    server = store.cluster.all_servers(topo)[0]
    with pytest.raises(Exception, match="never updated"):
        server.run(admin([f"UPDATE {quote(str(topo.owned_db), 'owned')} SET `shard` = 9999"]))
    assert store.get_many([key]) == [{"id": key, "n": 1}]


def test_rows_copied_in_before_a_flip_are_never_read(make_store: Any, scan: str) -> None:
    store = make_store([BY_N])
    topo = store.cluster.topology
    shard = 3
    other = next(sid for sid in topo.servers if sid != topo.shard_servers[shard])
    v = _value_on(store, shard)
    entity = {"id": _id_on(store, shard), "n": v}
    rest = [{"n": n} for n in range(1000, 1020)]  # none is v
    store.put_many([entity, *rest])
    version = store.get(entity["id"]).version
    ghost = {"id": _id_on(store, shard), "n": v}  # on the other server only
    db = topo.owned_db
    assert db is not None
    entities, index = quote(db, "entities"), quote(db, BY_N.table)
    _copy_in(
        store,
        other,
        shard,
        [
            f"INSERT INTO {entities} (`shard`, `id`, `version`, `updated`, `body`)"
            " VALUES (%s, %s, %s, 0, %s), (%s, %s, 1, 0, %s)",
            f"INSERT INTO {index} (`shard`, `p_n`, `entity_id`, `entity_version`)"
            " VALUES (%s, %s, %s, %s), (%s, %s, %s, 1)",
        ],
        [
            *(shard, entity["id"], version, store.codec.encode({**entity, "copy": True})),
            *(shard, ghost["id"], store.codec.encode(ghost)),
            *(shard, v, entity["id"], version, shard, v, ghost["id"]),
        ],
    )
    assert store.get_many([entity["id"], ghost["id"]]) == [entity, None]
    assert store.get(ghost["id"]) is None
    assert [e["id"] for e in store.query(BY_N, n=v)] == [entity["id"]]
    committed = sorted(e["id"] for e in [entity, *rest])
    for order in ("asc", "desc"):  # a scatter: every shard of both servers
        everything = list(store.iter(BY_N, n__gte=0, order=order, page_size=3))
        assert sorted(e["id"] for e in everything) == committed
    assert sorted(e["id"] for e in store.reader.newest(1000)) == committed  # the samples'


def test_rows_left_behind_after_a_fence_fail_the_read(make_store: Any, scan: str) -> None:
    store = make_store([BY_N])
    shard = 5
    v = _value_on(store, shard)
    entity = {"id": _id_on(store, shard), "n": v}
    elsewhere = {"id": _id_on(store, 2), "n": _value_on(store, 2)}
    store.put_many([entity, elsewhere])
    with _fenced(store, shard):
        with pytest.raises(TableMissing):
            store.get_many([entity["id"], elsewhere["id"]])
        with pytest.raises(TableMissing):
            store.get(entity["id"])
        with pytest.raises(TableMissing):
            store.query(BY_N, n=v)
        for partial in (False, True):  # a shard given away is no unreachable server
            with pytest.raises(TableMissing):
                store.query(BY_N, n__gte=0, partial=partial)
        assert store.get(elsewhere["id"]) == elsewhere  # other shards answer
        assert store.query(BY_N, n=elsewhere["n"]) == [elsewhere]
    assert store.get_many([entity["id"]]) == [entity]


def test_reads_in_the_layout_of_a_database_per_shard(make_store: Any) -> None:
    """The same reads, and the declaration's checks (emptiness, the fit sample), on a
    datastore in the layout before the owned one."""
    store = make_store([BY_N], layout="databases")
    assert store.cluster.topology.owned_db is None
    assert store.declare_index(Index("by_m", {"m": "int"})) == "ready"  # empty
    entities = [{"n": n % 7, "m": n, "title": "x" * (n % 3)} for n in range(30)]
    store.put_many(entities)
    ids = [e["id"] for e in entities]
    assert store.get_many([*ids, new_id()]) == [*entities, None]
    assert sorted(e["id"] for e in store.reader.newest(1000)) == sorted(ids)
    assert {e["id"] for e in store.query(BY_N, n=3)} == {e["id"] for e in entities if e["n"] == 3}
    paged = list(store.iter(BY_N, n__gte=2, order="desc", page_size=4))
    assert [e["n"] for e in paged] == sorted(
        (e["n"] for e in entities if e["n"] >= 2), reverse=True
    )
    with pytest.raises(IndexDoesNotFit, match="of 30 sampled, 10 have a value"):
        store.declare_index(Index("by_title", {"title": "str(1)"}))
    assert store.declare_index(Index("by_title", {"title": "str(2)"})) == "building"


@pytest.mark.parametrize(
    ("case", "described"),
    [
        ("every other", True),
        ("every other, moved", True),
        ("a block", True),
        ("scattered", False),
        ("a few", False),
    ],
)
def test_the_check_selects_exactly_its_shards(make_store: Any, case: str, described: bool) -> None:
    """Many shards are checked as a progression with exceptions (a list of 2,048 cost
    the server 3-5 ms a batch): the condition selects exactly the shards named."""
    rng = random.Random(case)
    names = {
        "every other": range(0, 4096, 2),
        "every other, moved": sorted(
            (set(range(1, 4096, 2)) - set(rng.sample(range(1, 4096, 2), 40)))
            | set(rng.sample(range(0, 4096, 2), 25))
        ),
        "a block": range(1024, 2048),
        "scattered": sorted(rng.sample(range(4096), 300)),
        "a few": [3, 9, 10],
    }[case]
    names = tuple(names)
    cond = among(names)
    assert ("MOD" in cond) == described
    catalog = make_store().cluster.catalog  # the sequence engine's table of 0..65535
    every = f"SELECT seq AS `shard` FROM {quote(catalog.db, 'seq_0_to_65535')}"
    sql = f"SELECT `shard` FROM ({every}) t WHERE {cond}"
    server = catalog.server
    assert tuple(int(s) for (s,) in server.run(sql)[0]) == names
