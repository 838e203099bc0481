"""``schemaless index create ... --dry-run``: estimates from the stored entities, and
nothing declared."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from click.testing import CliRunner, Result

from schemaless import DataStore, Index
from schemaless.cleaner.estimate import _read, added_ranges, estimate
from schemaless.cli.main import cli
from schemaless.ids import id_hex
from schemaless.local import LocalCluster

BY_N = Index("by_n", {"n": "int"})


def create(local_cluster: LocalCluster, store: DataStore, *args: str) -> Result:
    env = {
        "SCHEMALESS_LOCAL_DIR": str(local_cluster.base_dir),
        "SCHEMALESS_PREFIX": store.cluster.topology.prefix,
        "SCHEMALESS_URL": None,
        "SCHEMALESS_USER": None,
        "SCHEMALESS_PASSWORD": None,
        "SCHEMALESS_OPTION_FILE": None,
    }
    return CliRunner(env=env).invoke(
        cli, ["index", "create", "by_n", "--property", "n:int", *args], catch_exceptions=False
    )


def load(store: DataStore, good: int, bad: int, rowless: int, deleted: int) -> list[bytes]:
    """Entities with an int ``n``, a string ``n`` (does not fit), none; some deleted.
    The ids of the bad ones."""
    entities = [{"n": i} for i in range(good)]
    bad_ones = [{"n": f"not a number {i}"} for i in range(bad)]
    entities += bad_ones + [{"title": "no n"} for _ in range(rowless)]
    store.put_many(entities)
    for entity in entities[:deleted]:
        store.delete(entity["id"])
    return [e["id"] for e in bad_ones]


def tables_named(store: DataStore, table: str) -> int:
    """How many databases of the datastore have a table of that name."""
    topo = store.cluster.refresh()
    found = 0
    for server in store.cluster.all_servers(topo).values():
        rows = server.run(
            "SELECT COUNT(*) FROM information_schema.tables"
            " WHERE table_name = %s AND table_schema LIKE %s",
            (table, topo.prefix.replace("_", "\\_") + "\\_%"),
        )[0]
        found += int(rows[0][0])
    return found


def test_dry_run_reports_values_that_do_not_fit_and_creates_nothing(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store = make_store()
    bad = load(store, good=300, bad=20, rowless=30, deleted=10)
    result = create(local_cluster, store, "--dry-run")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "dry run: index by_n: nothing declared" in out
    assert "sampled      350 entity rows on 8 shards (every row: figures exact)" in out
    assert re.search(
        r"\n {15}of the rows stored at \d\d:\d\d:\d\d UTC: "
        r"rows written since are not in them\n",
        out,
    )
    assert "rows written before the backfill starts add to its rows" in out
    assert "entities     340 live, 10 tombstones" in out
    assert "index rows   290 (0.85 per entity; 30 entities lack a property: no row)" in out
    assert "unindexable  5.9% of entities (20): values that do not fit" in out
    examples = [line for line in out.splitlines() if line.startswith("    entity ")]
    assert len(examples) == 5
    assert all(line.split()[1] in {id_hex(k) for k in bad} for line in examples)
    assert "property 'n' of index 'by_n' cannot be indexed" in examples[0]
    assert "index size   ~" in out and "backfill ETA" in out

    report = json.loads(create(local_cluster, store, "--dry-run", "--json").output)
    assert report["exact"] and report["sampled_rows"] == 350
    assert (report["entities"], report["index_rows"], report["unindexable"]) == (340, 290, 20)
    assert report["exists"] is None and len(report["examples"]) == 5
    # rows of 8-byte values: about 100 bytes each with both B-trees, less than 1 KB
    assert 290 * 60 < report["size_bytes"] < 290 * 1000
    assert report["rows_per_s"] > 0 and report["eta_s"] >= report["grace_s"] > 0

    # nothing declared: no catalog entry, no table
    assert "by_n" not in store.cluster.refresh().indexes
    assert tables_named(store, "index_by_n") == 0
    # the same command without --dry-run refuses it (values do not fit); --force declares it
    refused = create(local_cluster, store)
    assert refused.exit_code == 1 and "20 have a value that does not fit" in refused.output
    assert "by_n" not in store.cluster.refresh().indexes
    declared = json.loads(create(local_cluster, store, "--json", "--force").output)
    assert declared == {"definition": BY_N.to_dict(), "existed": False, "state": "building"}
    assert tables_named(store, "index_by_n") == 2  # owned layout: one per server


def test_dry_run_of_an_existing_index(make_store: Any, local_cluster: LocalCluster) -> None:
    store = make_store(indexes=[BY_N])
    out = create(local_cluster, store, "--dry-run").output
    assert "index by_n already exists and is ready: create changes nothing" in out
    assert "no entities stored: by_n would be ready at once" in out
    assert "--dry-run" in CliRunner().invoke(cli, ["index", "create", "--help"]).output
    result = create(local_cluster, store, "--dry-run", "--property", "m")
    assert result.exit_code == 1 and "different definition" in result.output
    assert "create would fail" in result.output
    assert store.cluster.refresh().indexes["by_n"].index == BY_N


def test_one_entity_without_the_property_is_one_entity(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    store = make_store()
    store.put_many([{"n": 1}, {"m": 2}])
    out = create(local_cluster, store, "--dry-run").output
    assert "(0.50 per entity; 1 entity lacks a property: no row)" in out


def test_a_sample_estimates_the_whole(make_store: Any) -> None:
    store = make_store()
    load(store, good=1800, bad=200, rowless=0, deleted=0)
    est = estimate(store, BY_N, sample=0)  # 100 rows per shard, in 10 segments
    assert not est.exact and est.sampled == 800
    # added_id has no gaps here: each segment's span says how many rows the shard holds
    assert round(est.stored) == round(est.entities) == 2000
    # the bad ones came last: a segment of each shard's last tenth finds them
    assert 0.05 < est.unindexable / est.entities < 0.15  # 10% in truth
    assert round(est.rows + est.unindexable) == 2000


def test_a_multi_valued_index_counts_elements(make_store: Any) -> None:
    store = make_store()
    store.put_many([{"tags": ["a", "b", "c", "a"]} for _ in range(30)])  # 3 distinct
    store.put_many([{"tags": []} for _ in range(10)])
    est = estimate(store, Index("by_tag", {"tags": "str(8)"}, multi="tags"))
    assert est.exact and (est.entities, est.rows, est.rowless) == (40, 90, 10)
    assert est.as_dict()["rows_per_entity"] == 2.25


def test_a_sample_is_of_the_rows_stored_when_it_started(make_store: Any) -> None:
    """Rows a writer adds while the shards are read are not in the sample: each shard's
    figures are of the rows within the range measured first (a user's trial saw a dry
    run under a writer mix rows of several moments)."""
    store = make_store()
    load(store, good=400, bad=0, rowless=0, deleted=0)
    topo = store.cluster.refresh()
    spans = added_ranges(store, topo)
    load(store, good=400, bad=0, rowless=0, deleted=0)  # a writer, meanwhile
    whole = 0
    for shard, (before, top, _) in spans.items():
        for budget in (10, 10_000):  # in segments, and whole
            segments = _read(store, topo, shard, before, top, budget)
            assert all(row[0] <= top for rows, _ in segments for row in rows)
        whole += sum(len(rows) for rows, _ in segments)
    assert whole == 400
    est = estimate(store, BY_N)
    assert est.exact and est.entities == 800
    assert abs(time.time() - est.as_of) < 60 and est.as_dict()["as_of"].endswith("Z")
