"""The layout benchmark (bench/layout.py) at a tiny scale on the test cluster: its
shapes, the moves' fences, and the ownership check that detects a stale map."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest

from bench.data import Dataset
from bench.env import RawClient, Servers
from bench.layout import LayoutConfig, drop, format_markdown, run
from bench.layoutmove import move_shard
from bench.layouts import (
    LAYOUTS,
    KeyTableLayout,
    OwnedLayout,
    Placement,
    StaleMap,
    make_data,
)
from bench.layoutwrites import WRITE_LAYOUTS, WRITE_OPS, WRITE_SETS
from schemaless.codec import Codec
from schemaless.local import LocalCluster


@pytest.fixture
def servers(local_cluster: LocalCluster) -> Servers:
    return Servers(tuple(local_cluster.addresses), str(local_cluster.option_file))


def _databases(servers: Servers, prefix: str) -> list[str]:
    out = []
    for i in range(len(servers.addresses)):
        out += [r[0] for r in servers.admin(i, "SHOW DATABASES") if r[0].startswith(prefix)]
    return out


def test_placement_follows_moves() -> None:
    place = Placement("lay4", 8, 2)
    assert [place.sid(s) for s in range(8)] == [0, 1] * 4
    place.moved[2] = 1
    assert place.shards_on(0) == [0, 4, 6] and place.shards_on(1) == [1, 2, 3, 5, 7]
    assert place.shard_db(7) == "lay4_s0007" and place.side_db in place.databases()


def test_layout_benchmark_tiny(servers: Servers, local_cluster: LocalCluster) -> None:
    prefix = "bl" + uuid.uuid4().hex[:6]
    cfg = LayoutConfig(entities=400, per_server=[4], rounds=2, slice_ops=3, hold=0.3,
                       prefix=prefix)  # fmt: skip
    pids = [p for p in (s.pid() for s in local_cluster.servers) if p is not None]
    results = run(cfg, servers=servers, pids=pids)  # fails if two layouts disagree
    assert _databases(servers, prefix) == []  # dropped at the end
    data: dict[str, Any] = json.loads(json.dumps(results))
    (size,) = data["sizes"]
    assert size["n_shards"] == 8 and set(size["ops"]) == {"get_many", "query_eq", "scatter"}
    for by in size["ops"].values():
        assert list(by) == list(LAYOUTS)
        for r in by.values():
            assert r["ops"] == 6 and 0 < r["p50_ms"] <= r["p99_ms"], r
            assert math.isfinite(r["client_cpu_us"]) and r["server_cpu_us"] is not None
    moves = {(m["kind"], m["held_s"] > 0): m for m in size["moves"]}
    assert len(moves) == 10 and all(m["rows"] > 0 for m in moves.values())
    # what a client with the old map meets at the source after each layout's fence
    assert moves["a", False]["stale_write"] == "error 1146"  # RENAME: table gone
    assert moves["a", False]["stale_read"] == "error 1146"
    assert moves["c", False]["stale_write"] == "error 1526"  # no partition for the value
    assert moves["c", False]["stale_read"] == "0 rows read"  # ... but reads miss silently
    assert moves["b_lead", False]["stale_write"] == "1 rows written"  # no fence at all
    assert moves["d", False]["stale_write"] == "0 rows written"  # the owned row is gone
    assert moves["d", False]["stale_read"] == "0 rows read"
    # EXCHANGE PARTITION waits for a transaction on another shard of the table
    assert moves["c", True]["fence_s"] >= cfg.hold / 2
    # the writes: every cell on every write layout, the same rows held at the end
    cells = {f"{op} {s}" for op in WRITE_OPS for s in WRITE_SETS}
    assert set(size["writes"]) == cells
    for by in size["writes"].values():
        assert list(by) == list(WRITE_LAYOUTS)
        assert all(r["ops"] == 6 and 0 < r["p50_ms"] <= r["p99_ms"] for r in by.values())
    text = format_markdown(data)
    assert "| 4 | get_many | d_owned |" in text and "| 4 | c |" in text
    assert "| 4 | update i3 | d_owned |" in text and "vs today (p50)" in text


def test_owned_rows_detect_a_stale_map(servers: Servers) -> None:
    """After a move, a reader with the old map gets StaleMap from the ownership layout,
    where the plain one-table layout silently returns nothing."""
    prefix = "bo" + uuid.uuid4().hex[:6]
    place, stale = Placement(prefix, 4, 2), Placement(prefix, 4, 2)
    raw, codec = RawClient(servers), Codec()
    data = make_data(Dataset(200), 4, codec)
    try:
        owned, plain = OwnedLayout(place, raw, codec), KeyTableLayout(place, raw, codec)
        for layout in (owned, plain):
            layout.create()
            layout.load(data)
        ids = [key for shard, key, _, _ in data.entities if shard == 0][:5]
        assert all(owned.get_many(ids)) and all(plain.get_many(ids))
        for kind in ("d", "b_key"):
            move_shard(servers, raw, kind, Placement(prefix, 4, 2), 0, 1)
        place.moved[0] = 1
        assert all(owned.get_many(ids)) and all(plain.get_many(ids))  # the new map
        with pytest.raises(StaleMap):
            OwnedLayout(stale, raw, codec).get_many(ids)
        assert KeyTableLayout(stale, raw, codec).get_many(ids) == [None] * 5
    finally:
        raw.close()
        drop(servers, place)
    assert _databases(servers, prefix) == []
