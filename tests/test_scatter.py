"""The scatter primitive and the packet budget: pure parts, then on real servers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import MySQLdb._mysql
import pytest

from schemaless import DataStore
from schemaless.catalog import Topology
from schemaless.errors import SchemalessError, TableMissing
from schemaless.index import Index
from schemaless.owned import OWNED, admin, shards_sql, verdict_sql
from schemaless.scatter import (
    Statement,
    by_server,
    chunks,
    rounds,
    row_bytes,
    server_reads,
    shard_is,
    shard_unions,
    sql_bytes,
)
from schemaless.tables import union_all


def _topo(shard_servers: tuple[int, ...]) -> Topology:
    return Topology(
        prefix="p",
        n_shards=len(shard_servers),
        map_version=1,
        refresh_interval=5.0,
        servers=dict.fromkeys(range(3), None),  # type: ignore[arg-type]
        shard_servers=shard_servers,
        indexes={},
        dictionary_ids=(),
        active_dictionary=None,
        index_epoch=1,
    )


def test_by_server_groups_items_by_the_server_of_their_shard_in_order() -> None:
    topo = _topo((0, 1, 0, 1, 2))
    items = [(4, "a"), (0, "b"), (1, "c"), (2, "d"), (3, "e")]
    assert by_server(topo, items, lambda item: item[0]) == {
        2: [(4, "a")],
        0: [(0, "b"), (2, "d")],
        1: [(1, "c"), (3, "e")],
    }


def test_shard_unions_name_every_shard_once_and_skip_servers_without_any() -> None:
    topo = _topo((0, 0, 2, 0))
    unions = shard_unions(topo, lambda s: f"SELECT {s}", " LIMIT 1")
    assert unions == {
        0: "SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 3 LIMIT 1",
        2: "SELECT 2 LIMIT 1",
    }
    assert union_all(["SELECT 1"]) == "SELECT 1"


def test_server_reads_take_each_servers_shards_of_the_map() -> None:
    """Owned layout: one statement per server over its shards of the map, then the
    check; the layout of a database per shard: the union of per-shard parts."""
    old = _topo((0, 0, 2, 0))
    owned = dataclasses.replace(old, layout=OWNED)

    def whole(db: str, shards: list[int]) -> str:
        return f"SELECT 1 FROM {db} WHERE {shards_sql(shards)}"

    reads = server_reads(owned, whole, lambda s: f"SELECT {s}")
    assert set(reads) == {0, 2}
    first, check = reads[0].split(";\n")
    assert first == "SELECT 1 FROM p_data WHERE `shard` IN (0, 1, 3)"
    assert check == verdict_sql("p_data", [0, 1, 3])
    assert server_reads(old, whole, lambda s: f"SELECT {s}", " LIMIT 1") == shard_unions(
        old, lambda s: f"SELECT {s}", " LIMIT 1"
    )


def test_chunks_keep_order_and_budget_and_send_an_oversized_item_alone() -> None:
    items = [3, 4, 2, 11, 1, 1, 5]
    parts = list(chunks(items, lambda n: n, 7))
    assert [x for part in parts for x in part] == items
    assert parts == [[3, 4], [2], [11], [1, 1, 5]]
    assert list(chunks([], lambda n: n, 7)) == []


@pytest.mark.parametrize(
    "values",
    [
        ("a" * 50, b"\x00'\\" * 40, 12345678901234, 1.5e300),
        ("\U0001f600'" * 30, "\\" * 64, b"\xff" * 16),
        (None, True, -(2**63)),
    ],
)
def test_sql_bytes_bounds_the_escaped_literals(values: tuple[Any, ...]) -> None:
    literals = []
    for v in values:
        if isinstance(v, str):
            literals.append(MySQLdb._mysql.string_literal(v.encode()))
        elif isinstance(v, bytes):
            literals.append(MySQLdb._mysql.string_literal(v))
        else:
            literals.append(str(v).encode())
    row = b"(" + b", ".join(literals) + b")"
    assert len(row) <= sql_bytes(values)


def test_row_bytes_bound_the_rows_of_an_index() -> None:
    index = Index("by_name", {"name": "str(20)", "n": "int"})
    worst = ("\U0001f600'" * 10, -(2**63), b"\xff" * 16, 2**62)
    assert sql_bytes(worst) <= row_bytes(index)


# -- on real servers ----------------------------------------------------------------------


def _each_server(store: DataStore) -> tuple[Topology, dict[int, int]]:
    topo = store.cluster.current()
    return topo, {sid: sid for sid in topo.servers}


def test_scatter_runs_one_batch_per_server_and_returns_each_ones_rows(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store()
    topo, groups = _each_server(store)
    assert len(groups) >= 2
    found = store.cluster.scatter(topo, groups, lambda sid: ("SELECT %s", [sid])).results
    assert {sid: rows[0][0][0] for sid, rows in found.items()} == groups


def test_scatter_partial_returns_errors_by_server_and_raises_without_it(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store()
    topo, groups = _each_server(store)
    bad = min(groups)

    def build(sid: int) -> Statement:
        table = "no_such_table" if sid == bad else "entities"
        return admin([f"SELECT COUNT(*) FROM `{topo.dbs[topo.shards_of(sid)[0]]}`.`{table}`"]), ()

    results, errors, _ = store.cluster.scatter(topo, groups, build, partial=True)
    assert set(errors) == {bad} and isinstance(errors[bad], TableMissing)
    assert set(results) == set(groups) - {bad}
    with pytest.raises(TableMissing):
        store.cluster.scatter(topo, groups, build)


def test_scatter_of_a_write_returns_its_affected_row_counts(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store()
    store.put_many([{"n": i} for i in range(20)])
    topo, groups = _each_server(store)

    def build(sid: int) -> Statement:
        stmts = [
            f"UPDATE `{topo.dbs[s]}`.`entities` SET `updated` = `updated` + 1"
            f" WHERE {shard_is(topo, s)}TRUE"
            for s in topo.shards_of(sid)
        ]
        return admin(["START TRANSACTION", *stmts, "COMMIT"]), ()

    counts = store.cluster.scatter(topo, groups, build, commits=True).counts
    assert set(counts) == set(groups)
    assert sum(sum(c) for c in counts.values()) == 20


def test_rounds_send_in_order_and_stop_a_failed_server(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store()
    topo, groups = _each_server(store)
    bad = min(groups)
    servers = store.cluster.all_servers(topo)
    batches: dict[int, list[Statement]] = {
        sid: [("SELECT 1", ()), ("SELECT 2", ()), ("SELECT 3", ())] for sid in groups
    }
    good = rounds(servers.__getitem__, batches)
    assert {sid: [r[0][0][0] for r in rows] for sid, rows in good.items()} == {
        sid: [1, 2, 3] for sid in groups
    }
    db = topo.dbs[topo.shards_of(bad)[0]]
    store.cluster.server_of_shard(topo, topo.shards_of(bad)[0]).run(
        admin([f"CREATE TABLE `{db}`.`marks` (n INT)"])
    )
    batches[bad] = [
        ("SELECT * FROM no_such_db.no_such_table", ()),
        (admin([f"INSERT INTO `{db}`.`marks` VALUES (1)"]), ()),
    ]
    with pytest.raises(SchemalessError):
        rounds(servers.__getitem__, batches)
    assert servers[bad].run(admin([f"SELECT COUNT(*) FROM `{db}`.`marks`"]))[0][0][0] == 0
