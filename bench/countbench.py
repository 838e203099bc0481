"""``python -m bench.countbench``: counts (issue 40) against raw ``SELECT COUNT(*)``.

On one local cluster (``--dir``) and in one run, interleaved (``run_interleaved``):

* ``ds.count(likes, entry=e)`` (exact, from the counters) and ``exact=False`` (the
  index rows) for an ``entry`` with 1k and one with ``--big`` (100k) likes, against raw
  ``SELECT COUNT(*) FROM <data>.index_likes WHERE shard IN (...) AND p_entry = %s``
  sent to every server in parallel (the index's one table per server; the baseline
  the issue names);
* the write cost of a counted index: put (a new like), update (a like moved to
  another entry, compare-and-set) and delete on a datastore whose index is counted,
  against the same index uncounted in another datastore.

Prints one JSON object (ratios and the samples).  Example:
``python -m bench.countbench --dir /tmp/bench-cluster --big 100000 --seconds 4``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import uuid
from collections.abc import Iterator
from typing import Any

from schemaless import DataStore, Index, new_id
from schemaless.names import quote
from schemaless.owned import shards_sql

from .env import RawClient, Servers, start_cluster
from .measure import Sample, run_interleaved

__all__ = ["main"]

SMALL, BIG = 1, 2  # the two entries counted


def _index(counted: bool) -> Index:
    return Index("likes", {"entry": "int", "user": "int"}, counted=counted)


def _open(servers: Servers, counted: bool) -> DataStore:
    prefix = "cb_" + uuid.uuid4().hex[:10]
    return DataStore(
        list(servers.addresses), [_index(counted)], prefix=prefix, option_file=servers.option_file
    )


def _load(ds: DataStore, entry: int, n: int) -> None:
    for start in range(0, n, 1000):
        ds.put_many({"entry": entry, "user": u} for u in range(start, min(n, start + 1000)))


def _raw_count(raw: RawClient, ds: DataStore) -> Any:
    """Raw ``COUNT(*)`` of an entry's index rows, every server in parallel."""
    topo = ds.cluster.refresh()
    db = topo.owned_db
    assert db is not None
    table = quote(db, "index_likes")
    order = {str(a): i for i, a in enumerate(raw.servers.addresses)}
    where = {
        order[str(topo.servers[sid])]: shards_sql(shards) for sid, shards in topo.placed.items()
    }

    def count(entry: int) -> int:
        batches = {
            i: (f"SELECT COUNT(*) FROM {table} WHERE {w} AND `p_entry` = %s", [entry])
            for i, w in where.items()
        }
        return sum(int(sets[0][0][0]) for sets in raw.fanout(batches).values())

    return count


def _writes(ds: DataStore) -> dict[str, Any]:
    """put / update / delete of likes on entry 3 (updates and deletes start on 5,000
    likes made first)."""
    made = [{"id": new_id(), "entry": 3, "user": u} for u in range(5000)]
    ds.put_many(made)
    turn = itertools.count()

    def put(_: object) -> None:
        like = {"id": new_id(), "entry": 3, "user": len(made)}
        ds.put(like)
        made.append(like)

    def update(_: object) -> None:
        stored = ds.get(made[next(turn) % len(made)]["id"])
        assert stored is not None
        ds.put({**stored, "entry": 4 + stored["entry"] % 2}, expect_version=stored.version)

    def delete(_: object) -> None:
        like = made.pop()
        ds.delete(like["id"])

    return {"put": put, "update": update, "delete": delete}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.countbench")
    parser.add_argument("--dir", default=".bench-cluster", help="the local cluster's directory")
    parser.add_argument("--big", type=int, default=100_000, help="likes of the big entry")
    parser.add_argument("--seconds", type=float, default=4.0, help="per measured call")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    servers = start_cluster(args.dir)
    counted, plain = _open(servers, True), _open(servers, False)
    raw = RawClient(servers)
    try:
        _load(counted, SMALL, 1000)
        _load(counted, BIG, args.big)
        assert counted.count("likes", entry=BIG) == args.big
        raw_count = _raw_count(raw, counted)
        assert raw_count(BIG) == args.big
        calls: dict[str, tuple[Any, Iterator[Any]]] = {}
        for label, entry in (("1k", SMALL), ("big", BIG)):
            calls[f"raw {label}"] = (raw_count, itertools.repeat(entry))
            calls[f"exact {label}"] = (
                lambda e: counted.count("likes", entry=e),
                itertools.repeat(entry),
            )
            calls[f"rows {label}"] = (
                lambda e: counted.count("likes", entry=e, exact=False),
                itertools.repeat(entry),
            )
        reads = run_interleaved(calls, 1, args.seconds, args.rounds)
        writes: dict[str, tuple[Any, Iterator[Any]]] = {}
        for name, ds in (("counted", counted), ("plain", plain)):
            for op, fn in _writes(ds).items():
                writes[f"{op} {name}"] = (fn, itertools.repeat(None))
        wrote = run_interleaved(writes, 1, args.seconds, args.rounds)
        print(json.dumps(_report(reads, wrote, args.big), indent=2))
    finally:
        raw.close()
        for ds in (counted, plain):
            _drop(servers, ds)


def _report(reads: dict[str, Sample], wrote: dict[str, Sample], big: int) -> dict[str, Any]:
    mean = {name: s.summary()["mean_ms"] for name, s in {**reads, **wrote}.items()}
    ratios = {
        f"{kind} {label} / raw": round(mean[f"{kind} {label}"] / mean[f"raw {label}"], 2)
        for kind in ("exact", "rows")
        for label in ("1k", "big")
    }
    ratios |= {
        f"{op} counted / plain": round(mean[f"{op} counted"] / mean[f"{op} plain"], 2)
        for op in ("put", "update", "delete")
    }
    return {"big": big, "mean_ms": mean, "ratios": ratios}


def _drop(servers: Servers, ds: DataStore) -> None:
    prefix = ds.cluster.topology.prefix
    ds.close()
    for i in range(len(servers.addresses)):
        for (name,) in servers.admin(i, "SHOW DATABASES LIKE %s", [prefix + "\\_%"]):
            servers.admin(i, f"DROP DATABASE {quote(name)}")


if __name__ == "__main__":
    main()
