"""The owned layout's ``entities`` is clustered on ``id`` (docs/architecture.md,
"Clustered by id"): a read by id is a dive into the primary key, and a shard's scans in
insert order walk ``by_shard_added`` (the recent scan ``by_updated``), never the whole
table and never a sort of the shard's rows, however many shards a server holds.
EXPLAINed on real servers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cleaner.sql import (
    added_ranges_sql,
    entity_versions_sql,
    purge_sql,
    recent_batch_sql,
    versions_proof_sql,
)
from schemaless import DataStore
from schemaless.connection import Server
from schemaless.ids import new_id
from schemaless.movesync import Side, Syncer, shard_tables
from schemaless.owned import ADMIN, CHECK, admin
from schemaless.reader import _owned_get_sql
from schemaless.scatter import added_page_sql, ids_by_server
from schemaless.tables import by_id_sql

#: The access types of a read by a key (a value, a join's value, ranges of them).
_KEYED = ("const", "eq_ref", "ref", "range")
_COLUMNS = ("id", "select_type", "table", "type", "keys", "key", "key_len", "ref", "rows", "extra")


def _plans(server: Server, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    """The plan of each access to ``entities`` of the batch's statements that read it
    (each EXPLAINed with its share of the parameters)."""
    out: list[dict[str, Any]] = []
    for stmt in sql.removeprefix(ADMIN).split(";"):
        n = stmt.count("%s")
        mine, params = params[:n], params[n:]
        stmt = stmt.replace(CHECK, "").strip()
        if "`entities`" in stmt and stmt.split()[0] in ("SELECT", "DELETE"):
            rows = server.run(admin([f"EXPLAIN {stmt}"]), mine)[0]
            plan = [dict(zip(_COLUMNS, r, strict=False)) for r in rows]
            out += [p for p in plan if p["table"] in ("entities", "e")]
    return out


def _keyed(plans: list[dict[str, Any]], key: str | tuple[str, ...], most: int) -> None:
    """Every access reads ``key`` (one of them) by a value or a range, at most ``most``
    rows, unsorted."""
    assert plans
    for p in plans:
        assert p["key"] in ((key,) if isinstance(key, str) else key), str(p)
        assert p["type"] in _KEYED, str(p)
        assert int(p["rows"] or 0) <= most and "filesort" not in str(p["extra"]), str(p)


def _loaded(make_store: Callable[..., DataStore], shards: int) -> tuple[DataStore, list[bytes]]:
    """A datastore with 3,000 entities, and 2,000 rows more in the shard of the first
    (however many shards: enough that a scan or a sort would show in a plan)."""
    store = make_store(shards=shards)
    ids = [new_id() for _ in range(3000)]
    for n in range(0, len(ids), 500):
        store.put_many([{"id": key, "n": n} for key in ids[n : n + 500]])
    topo = store.cluster.topology
    shard = store.cluster.shard_of_id(ids[0])
    store.cluster.server_of_shard(topo, shard).run(
        admin(
            [
                f"INSERT INTO `{topo.owned_db}`.`entities` (`shard`, `id`, `version`,"
                f" `updated`, `body`) SELECT {shard}, RANDOM_BYTES(16), 1, `seq`, 'x'"
                " FROM `mysql`.`seq_1_to_2000`"
            ]
        )
    )
    for server in store.cluster.all_servers(topo).values():
        server.run(admin([f"ANALYZE TABLE `{topo.owned_db}`.`entities`"]))
    return store, ids


@pytest.mark.parametrize("shards", [16, 4096])  # 8 and 2,048 a server
def test_reads_by_id_dive_into_the_primary_key(
    make_store: Callable[..., DataStore], shards: int
) -> None:
    """get_many's read (one id, 100 ids; with the digest and counted), a point get."""
    store, ids = _loaded(make_store, shards)
    topo = store.cluster.topology
    servers = store.cluster.all_servers(topo)
    for count in (1, 100):
        for sid, groups in ids_by_server(topo, ids[:count]).items():
            for counted in (False, True):
                sql, params = by_id_sql(topo, groups, "`id`, `body`", counted=counted)
                _keyed(_plans(servers[sid], sql, params), "PRIMARY", count)
    shard = store.cluster.shard_of_id(ids[0])
    get = _owned_get_sql(topo.dbs[shard], shard)
    _keyed(_plans(store.cluster.server_of_shard(topo, shard), get, [ids[0]]), "PRIMARY", 1)


@pytest.mark.parametrize("shards", [16, 4096])
def test_a_shards_scans_walk_its_keys(
    make_store: Callable[..., DataStore], shards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scans' page (the Cleaner, the feed's snapshot, a dump), the backfill's
    re-read and proof, the estimate's ranges, a move's reads and its deletes by
    ``by_shard_added``; the recent scan and the purge by ``by_updated``, unsorted."""
    store, ids = _loaded(make_store, shards)
    topo = store.cluster.topology
    db = topo.owned_db
    assert db is not None
    shard = store.cluster.shard_of_id(ids[0])
    server = store.cluster.server_of_shard(topo, shard)
    most = 5000  # the rows of a server's shards at most

    def on(key: str, sql: str, params: list[Any]) -> None:
        _keyed(_plans(server, sql, params), key, most)

    on("by_shard_added", added_page_sql(topo, shard, "`added_id`, `body`", 1000), [0])
    on("by_shard_added", *entity_versions_sql(topo.dbs, db, shard, 0, 10**6))
    on("by_shard_added", *versions_proof_sql(topo.dbs, db, shard, [(1, 5), (9, 10**6)]))
    ranges = added_ranges_sql(topo.dbs, db, [shard]).removeprefix(ADMIN).split(";")[0]
    explained = server.run(admin([f"EXPLAIN {ranges.replace(CHECK, '')}"]))[0]
    assert [r[-1] for r in explained] == ["Select tables optimized away"]  # two dives
    on("by_updated", *recent_batch_sql(topo.dbs, db, shard, 0, 0, 1000))
    on("by_updated", *purge_sql(topo.dbs, db, shard, 1, 1000))  # few tombstones are old

    reads: list[tuple[Server, str, list[Any]]] = []
    read = Side.read

    def recorded(side: Side, sql: str, params: Any = ()) -> list[Any]:
        reads.append((side.server, sql, list(params)))
        return read(side, sql, params)

    monkeypatch.setattr(Side, "read", recorded)
    other = next(s for s in store.cluster.all_servers(topo).values() if s is not server)
    entities = shard_tables(topo)[0]
    assert entities.name == "entities"
    # a move's copy to the other server (it does not own the shard) in chunks of 500
    copied, _ = Syncer(500, 1 << 20).sync(Side(server, db, shard), Side(other, db, shard), entities)
    assert copied >= 2000
    heavy = [r for r in reads if " IN (" in r[1]]  # the bodies of the rows to copy
    assert heavy and len(reads) > len(heavy) >= 4
    for where, sql, params in reads:  # the bodies' rows by `added_id IN`: either key
        keys = ("by_shard_added", "by_added") if " IN (" in sql else "by_shard_added"
        _keyed(_plans(where, sql, params), keys, most)
    # a move's delete of a shard's rows where the server does not own it (``Syncer.
    # delete``, as ``drop_old_copies`` sends it): the copy just made on the other server
    unowned = f"NOT EXISTS (SELECT 1 FROM `{db}`.`owned` WHERE `shard` = {shard})"
    delete = (
        f"DELETE FROM `{db}`.`entities` WHERE `shard` = {shard} AND {unowned}"
        " ORDER BY `shard`, `added_id` LIMIT 500"
    )
    _keyed(_plans(other, delete, []), "by_shard_added", most)
    assert Syncer(500, 1 << 20).delete(Side(other, db, shard), [entities], 0) == copied
