"""The Cleaner in the owned layout (one table per server, the logical shard a column),
and in the layout of a database per shard, which existing datastores keep.

In the owned layout a server's tables may hold rows of a logical shard it does not
own: a move's copy before its flip, or the rows it leaves behind after it.  The
Cleaner reads only the shards its map gives each server (``shard = s``, ``shard IN``)
and every batch ends with the ownership check, so such rows are never read, counted,
repaired or deleted, and a batch on a shard the server gave away fails (1146,
``TableMissing``) rather than reading nothing or writing nowhere.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import assert_clean, shard_rows
from test_cleaner import BY_LINK, BY_TAG, _delete_row, _set_version, load, plant

from schemaless import DataStore
from schemaless.catalog import Topology
from schemaless.cleaner import Cleaner, diff_indexes
from schemaless.cleaner import sql as cleaner_sql
from schemaless.cleaner.access import delete_rows, read_rows, upsert_rows
from schemaless.cleaner.estimate import Span
from schemaless.cleaner.scan import entity_batches, index_batch
from schemaless.errors import TableMissing
from schemaless.hashing import shard_of
from schemaless.ids import new_id
from schemaless.names import quote
from schemaless.owned import CHECK, LOCKED, UNCHECKED, VERDICT, admin, copying, unguarded
from schemaless.schema import shard_db
from schemaless.writes import IndexRow

LINK = quote(BY_LINK.columns[0])


def _builders(dbs: list[str], owned: str | None) -> dict[str, tuple[bool, str]]:
    """Every SQL builder of the Cleaner's ``sql.py``, called: name -> (writes, SQL)."""
    k = b"k" * 16
    row = (BY_LINK, 1, ("a",), k, 3)
    return {
        "rows_by_entity_sql": (
            False,
            cleaner_sql.rows_by_entity_sql(dbs, owned, [1, 2], [BY_LINK, BY_TAG], [k])[0],
        ),
        "rows_by_key_sql": (
            False,
            cleaner_sql.rows_by_key_sql(dbs, owned, BY_LINK, 1, [("a", k)])[0],
        ),
        "entity_versions_sql": (False, cleaner_sql.entity_versions_sql(dbs, owned, 1, 0, 9)[0]),
        "versions_proof_sql": (False, cleaner_sql.versions_proof_sql(dbs, owned, 1, [(1, 2)])[0]),
        "recent_batch_sql": (False, cleaner_sql.recent_batch_sql(dbs, owned, 1, 0, 0, 10)[0]),
        "backlog_sql": (False, cleaner_sql.backlog_sql(dbs, owned, {1: 0, 2: 0})[0]),
        "added_ranges_sql": (False, cleaner_sql.added_ranges_sql(dbs, owned, [1, 2])),
        "delete_guarded_sql": (True, cleaner_sql.delete_guarded_sql(dbs, owned, [row])[0]),
        "fence_sql": (True, cleaner_sql.fence_sql(dbs, owned, [(1, k, 3)], 5)[0]),
        "bump_sql": (True, cleaner_sql.bump_sql(dbs, owned, 1, k, 1, 2)[0]),
        "index_upserts_sql": (
            True,
            cleaner_sql.index_upserts_sql(dbs, owned, BY_LINK, [(1, [("a", k, 1)])])[0],
        ),
        "purge_sql": (True, cleaner_sql.purge_sql(dbs, owned, 1, 0, 10)[0]),
    }


def test_every_builder_of_the_cleaner_ends_its_batch_with_the_check() -> None:
    """Owned layout: a read's check comes after its rows, a write's before its COMMIT
    in one transaction (a batch of many rows: a locking check first); every statement
    that reads by anything but an id or a primary key names its shards; rows written
    carry their shard.  The other layout: the statements it always sent, without a
    check or a ``shard`` column."""
    names = {n for n in cleaner_sql.__all__ if n.endswith("_sql")}
    owned = _builders(["d"] * 4, "d")
    assert set(owned) == names  # a new builder is checked here too
    by_shard = {
        "entity_versions_sql",
        "versions_proof_sql",
        "recent_batch_sql",
        "backlog_sql",
        "added_ranges_sql",
        "purge_sql",
    }
    for name, (writes, sql) in owned.items():
        unguarded(sql)  # Server.send would send it
        assert sql.count(CHECK) == 1, name
        if name == "index_upserts_sql":  # many rows: their shards' owned rows locked first
            assert sql.startswith(f"SET {LOCKED} = '1';\nSTART TRANSACTION;\n"), name
            assert sql.index(CHECK) < sql.index("INSERT") and "LOCK IN SHARE MODE" in sql
            assert sql.endswith(f"COMMIT;\nSET {LOCKED} = NULL"), name
        elif writes:
            assert sql.startswith("START TRANSACTION"), name
            assert sql.index(CHECK) < sql.index("COMMIT") == sql.rindex("COMMIT"), name
        else:
            assert sql.endswith(VERDICT) and "COMMIT" not in sql, name
        if name in by_shard:
            assert "`shard` = 1 AND" in sql or "WHERE `shard` = 1" in sql, name
    assert "AND `shard` IN (1, 2)" in owned["rows_by_entity_sql"][1]
    assert "(`shard`, `id`, `version`, `updated`)" in owned["fence_sql"][1]
    assert "(`shard`, `p_link`, `entity_id`, `entity_version`)" in owned["index_upserts_sql"][1]
    for name, (_, sql) in _builders([f"p_{s:04d}" for s in range(4)], None).items():
        assert CHECK not in sql and "`shard`" not in sql and "`d`" not in sql, name


def _link_on(topo: Topology, shards: list[int], tag: str) -> str:
    """A link value whose row is placed on one of ``shards``."""
    for i in range(10_000):
        link = f"http://{tag}/{i}"
        if shard_of(BY_LINK.shard_key((link,)), topo.n_shards) in shards:
            return link
    raise AssertionError("no such link")


def _copied_in(store: DataStore, sid: int, shard: int, table: str, row: dict[str, Any]) -> None:
    """Insert a row of ``shard`` into a table of server ``sid``, which does not own
    it, as a move's copy does (``owned.copying``)."""
    topo = store.cluster.current()
    cols = ", ".join(quote(c) for c in ("shard", *row))
    marks = ", ".join(["%s"] * (len(row) + 1))
    store.cluster.all_servers(topo)[sid].run(
        admin(
            copying(
                shard,
                [f"INSERT INTO {quote(topo.owned_db or '', table)} ({cols}) VALUES ({marks})"],
            )
        ),
        [shard, *row.values()],
    )


def _strangers(store: DataStore, sid: int, table: str, shards: list[int]) -> int:
    """Rows of these shards in a table of server ``sid``."""
    topo = store.cluster.current()
    found = store.cluster.all_servers(topo)[sid].run(
        admin(
            [
                f"SELECT COUNT(*) FROM {quote(topo.owned_db or '', table)}"
                f" WHERE `shard` IN ({', '.join(map(str, shards))})"
            ]
        )
    )
    return int(found[0][0][0])


def test_rows_of_shards_a_server_does_not_own_are_never_read(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    ids = load(store, 200)
    topo = store.cluster.refresh()
    assert topo.owned_db is not None and len(topo.servers) >= 2
    here, there = sorted(topo.servers)[:2]
    theirs = topo.shards_of(there)  # rows of these on ``here`` are strangers
    # an entity of one of their shards, and an index row of one of ``ids``' entities
    # on one of their shards, both copied into ``here``
    stranger = next(k for k in iter(new_id, None) if shard_of(k, topo.n_shards) in theirs)
    body = store.codec.encode({"link": "http://stranger/", "n": 1, "tags": ["x"]})
    _copied_in(
        store,
        here,
        shard_of(stranger, topo.n_shards),
        "entities",
        {"id": stranger, "version": 1, "updated": 1, "body": body},
    )
    link = _link_on(topo, theirs, "left-behind")
    row_shard = shard_of(BY_LINK.shard_key((link,)), topo.n_shards)
    _copied_in(
        store,
        here,
        row_shard,
        BY_LINK.table,
        {BY_LINK.columns[0]: link, "entity_id": ids[0], "entity_version": 1},
    )
    assert _strangers(store, here, "entities", theirs) == 1
    # the oracle neither expects the stranger's rows nor counts the left-behind row
    assert_clean(store)
    assert all(r.values != (link,) for r in read_rows(store, topo, [BY_LINK], [ids[0]]))
    # a pass and a backfill leave them alone: nothing to repair, nothing deleted
    figures = Cleaner(store).run_once()
    assert figures["orphans_deleted"] == figures["rows_upserted"] == 0
    store.declare_index(BY_TAG)
    cleaner = Cleaner(store, batch=50)
    assert cleaner.backfill("by_tag") == "ready"
    assert cleaner.figures.as_dict()["rows_backfilled"] == 2 * 200
    assert_clean(store)
    assert _strangers(store, here, BY_LINK.table, theirs) == 1
    assert _strangers(store, here, BY_TAG.table, theirs) == 0
    assert _strangers(store, here, "entities", theirs) == 1


def test_a_batch_on_a_shard_given_away_fails_and_changes_nothing(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    ids = load(store, 100)
    topo = store.cluster.refresh()
    key, link = ids[0], "http://example.com/0"
    row_shard = shard_of(BY_LINK.shard_key((link,)), topo.n_shards)
    entity_shard = shard_of(key, topo.n_shards)
    fenced = sorted({row_shard, entity_shard})
    servers = {topo.shard_servers[s] for s in fenced}
    everything = shard_rows(store, row_shard, BY_LINK.table, "COUNT(*)")[0][0]
    for s in fenced:  # a move's fence, as the old map's client never saw it
        store.cluster.server_of_shard(topo, s).run(
            admin([f"{UNCHECKED}DELETE FROM {quote(topo.dbs[s], 'owned')} WHERE `shard` = {s}"])
        )
    try:
        with pytest.raises(TableMissing):
            next(entity_batches(store, topo, entity_shard))
        with pytest.raises(TableMissing):
            index_batch(store, topo, row_shard, BY_LINK, None, 10)
        with pytest.raises(TableMissing):
            read_rows(store, topo, [BY_LINK], [key])
        with pytest.raises(TableMissing):
            delete_rows(store, topo, [(BY_LINK, row_shard, (link,), key, 10**9)])
        with pytest.raises(TableMissing):
            upsert_rows(store, topo, [IndexRow(BY_LINK, row_shard, ("http://new/",), key, 9)])
    finally:
        for s in fenced:
            store.cluster.server_of_shard(topo, s).run(
                admin([f"INSERT INTO {quote(topo.dbs[s], 'owned')} (`shard`) VALUES ({s})"])
            )
    assert servers  # the rows are as they were: the delete rolled back, no upsert
    assert shard_rows(store, row_shard, BY_LINK.table, "COUNT(*)")[0][0] == everything
    assert shard_rows(store, row_shard, BY_LINK.table, "entity_id", f"{LINK} = %s", (link,)) == [
        (key,)
    ]
    assert_clean(store)


def test_backfill_pass_and_verify_in_the_layout_of_a_database_per_shard(
    make_store: Any,
) -> None:
    """A datastore created before the owned layout keeps its Cleaner: backfill, the
    oracle, the pass's repairs (missing, behind and orphan rows, a fence) and the purge."""
    store = make_store(layout="databases")
    topo = store.cluster.refresh()
    assert topo.owned_db is None and topo.dbs[3] == shard_db(topo.prefix, 3)
    ids = load(store, 300)
    store.declare_index(BY_LINK)
    assert Cleaner(store, batch=70).backfill("by_link") == "ready"
    assert_clean(store)
    victim, behind, gone = ids[1], ids[2], ids[3]
    _delete_row(store, topo, BY_LINK, ("http://example.com/1",), victim)
    _set_version(store, topo, BY_LINK, ("http://example.com/2",), behind, 0)
    store.delete(gone)
    store.flush()  # its rows deleted, so the planted one is an orphan
    plant(store, BY_LINK, ("http://example.com/3",), gone, 1)
    plant(store, BY_LINK, ("http://nobody/",), new_id(), 5)  # no entity: fenced first
    summary = diff_indexes(store)["by_link"].summary()
    assert summary == {"missing": 1, "extra": 2, "behind": 1, "unindexable": 0}
    cleaner = Cleaner(store, tombstone_retention=3600)
    figures = cleaner.run_once()
    assert figures["rows_upserted"] >= 2 and figures["orphans_deleted"] == 2
    assert figures["fenced"] >= 1
    assert_clean(store)
    assert cleaner.run_once(now=time.time() + 7200)["purged"] >= 1
    assert_clean(store)


def test_the_feed_trim_and_the_purge_per_shard(make_store: Any) -> None:
    """The trim reads each shard's head row (``shard = s``) and deletes its change rows
    only; the purge deletes each shard's old tombstones only, by ``(shard, updated)``."""
    store = make_store(changes=True, shards=4)
    entities = [{"n": i} for i in range(12)]
    store.put_many(entities)
    keys = [e["id"] for e in entities]
    store.delete_many(keys[:5])

    def changes() -> list[int]:
        return [int(shard_rows(store, s, "changes", "COUNT(*)")[0][0]) for s in range(4)]

    def heads() -> list[int]:
        return [int(shard_rows(store, s, "changes_head", "seq")[0][0]) for s in range(4)]

    assert sum(changes()) == 17 and heads() == changes()
    cleaner = Cleaner(store, feed_retention=3600, tombstone_retention=3600)
    figures = cleaner.run_once()
    assert figures["feed_trimmed"] == figures["purged"] == 0
    figures = cleaner.run_once(now=time.time() + 7200)
    assert figures["feed_trimmed"] == 17 and figures["purged"] == 5
    assert changes() == [0] * 4 and sum(heads()) == 17  # the heads keep their numbers
    tombstones = [shard_rows(store, s, "entities", "COUNT(*)", "body IS NULL") for s in range(4)]
    assert tombstones == [[(0,)]] * 4
    assert sum(int(shard_rows(store, s, "entities", "COUNT(*)")[0][0]) for s in range(4)) == 7


def test_rows_left_from_a_span_and_the_density_seen() -> None:
    owned = Span(100, 1100, 0.25)  # 4 shards on the server: a quarter of the range
    assert owned.left(0, 0) == 250  # nothing read yet: the share
    assert owned.left(600, 125) == 125  # a quarter seen: a quarter of the 500 left
    assert owned.left(500, 400) == 600  # every added_id so far was the shard's
    assert Span(0, 1000, 1.0).left(0, 0) == 1000 and Span(0, 1000, 1.0).left(1000, 990) == 0


def test_the_backfill_estimates_its_rows_where_shards_share_added_ids(
    make_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written one by one, the entities of a server's shards interleave in its
    ``added_id``: the progress's total stays near the real count from the start."""
    store = make_store()
    for i in range(400):
        store.put({"link": f"http://one.by.one/{i}", "n": i})
    store.declare_index(BY_LINK)
    cleaner = Cleaner(store, batch=30)
    totals: list[int] = []
    update = cleaner.rt.progress.update

    def recorded(name: str, done: int, total: int | None, *args: Any, **kwargs: Any) -> None:
        totals.append(total or 0)
        update(name, done, total, *args, **kwargs)

    monkeypatch.setattr(cleaner.rt.progress, "update", recorded)
    assert cleaner.backfill("by_link") == "ready"
    assert totals and all(0.6 * 400 <= t <= 1.5 * 400 for t in totals), totals
    assert totals[-1] == 400
