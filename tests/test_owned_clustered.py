"""The owned layout's ``entities`` is clustered on ``(shard, id)`` (docs/architecture.md,
"The digest"): every statement that reads or changes entity rows names their shard, so
the server reaches them by a key (a read by id by the primary key, one dive an id;
a scan in insert order by ``by_shard_added``), never by scanning the table, however
many shards a server holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cleaner.sql import bump_sql, entity_versions_sql, fence_sql, versions_proof_sql
from schemaless import DataStore
from schemaless.connection import Server
from schemaless.counts import backfill_sql
from schemaless.ids import new_id
from schemaless.names import quote
from schemaless.owned import ADMIN, CHECK, TRIGGERED, admin
from schemaless.reader import _owned_get_sql
from schemaless.scatter import ids_by_server
from schemaless.tables import by_id_sql
from schemaless.topology import Topology
from schemaless.writes import BLIND, NEW, EntityWrite, WriteMode, entity_batch_sql, feed_sql

#: The access types of a read by a key (a value, a join's value, ranges of them).
_KEYED = ("const", "eq_ref", "ref", "range")
_DML = ("SELECT", "UPDATE", "INSERT", "DELETE")
_COLUMNS = ("id", "select_type", "table", "type", "keys", "key", "key_len", "ref", "rows", "extra")


def _plans(server: Server, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    """The plan of each entities access of a batch's statements (EXPLAIN each DML
    statement with its share of the parameters)."""
    out: list[dict[str, Any]] = []
    for stmt in sql.removeprefix(TRIGGERED).removeprefix(ADMIN).split(";\n"):
        n = stmt.count("%s")
        mine, params = params[:n], params[n:]
        inserts = stmt.startswith("INSERT") and " SELECT " not in stmt  # no read: no plan
        if "`entities`" in stmt and stmt.split()[0] in _DML and not inserts:
            rows = server.run(admin([f"EXPLAIN {stmt.replace(CHECK, '')}"]), mine)[0]
            plan = [dict(zip(_COLUMNS, r, strict=False)) for r in rows]
            out += [p for p in plan if p["table"] in ("entities", "e")]
    return out


def _keyed(plans: list[dict[str, Any]], key: str, most: int) -> None:
    assert plans
    for p in plans:
        assert p["key"] == key and p["type"] in _KEYED, p
        assert int(p["rows"] or 0) <= most and "filesort" not in str(p["extra"]), p


def _loaded(
    make_store: Callable[..., DataStore], shards: int, **kw: Any
) -> tuple[DataStore, list[bytes]]:
    """A datastore with 3,000 entities (enough that a scan would show in a plan)."""
    store = make_store(shards=shards, **kw)
    ids = [new_id() for _ in range(3000)]
    for n in range(0, len(ids), 500):
        store.put_many([{"id": key, "n": i} for i, key in enumerate(ids[n : n + 500])])
    return store, ids


def _server(store: DataStore, topo: Topology, shard: int) -> Server:
    return store.cluster.server_of_shard(topo, shard)


@pytest.mark.parametrize("shards", [16, 4096])
def test_reads_by_id_are_clustered_dives(make_store: Callable[..., DataStore], shards: int) -> None:
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
    _keyed(_plans(_server(store, topo, shard), get, [ids[0]]), "PRIMARY", 1)


def test_writes_and_the_cleaners_statements_reach_rows_by_key(
    make_store: Callable[..., DataStore],
) -> None:
    """Step 2's reads and updates of every kind, the change feed's copy, the counts'
    backfill, the Cleaner's fences and bumps by id; its scans by ``added_id``."""
    store, ids = _loaded(make_store, 16, changes=True)
    topo = store.cluster.topology
    db = topo.owned_db
    assert db is not None
    key = ids[7]
    shard = store.cluster.shard_of_id(key)
    server = _server(store, topo, shard)
    found = store.get(key)
    assert found is not None
    stored = found.version  # equal: a row found, a plan (never "impossible WHERE")
    for mode, body in ((BLIND, b"x"), (NEW, b"x"), (WriteMode.expect(3), b"x"), (BLIND, None)):
        w = EntityWrite(db, shard, key, stored, 1, body, mode, True)
        sql, params, _ = entity_batch_sql([w], (), topo.dbs, None, False, db)
        _keyed(_plans(server, sql, params), "PRIMARY", 1)
        _, (after, values) = feed_sql([w], shard=True)
        _keyed(_plans(server, after[0], values), "PRIMARY", 1)
    _keyed(_plans(server, *backfill_sql(db, shard, [(key, stored, [b"k" * 16])])), "PRIMARY", 1)
    _keyed(_plans(server, *fence_sql(topo.dbs, db, [(shard, key, 5)], 1)), "PRIMARY", 1)
    _keyed(_plans(server, *bump_sql(topo.dbs, db, shard, key, stored, stored + 1)), "PRIMARY", 1)
    scan = (
        f"SELECT `added_id`, `id`, `version`, `body` FROM {quote(db, 'entities')}"
        f" WHERE `shard` = {shard} AND `added_id` > %s ORDER BY `added_id` LIMIT 1000"
    )
    _keyed(_plans(server, scan, [0]), "by_shard_added", 3000)
    _keyed(_plans(server, *entity_versions_sql(topo.dbs, db, shard, 0, 9)), "by_shard_added", 50)
    proof = versions_proof_sql(topo.dbs, db, shard, [(1, 5), (9, 12)])
    _keyed(_plans(server, *proof), "by_shard_added", 50)
