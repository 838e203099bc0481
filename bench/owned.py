"""``python -m bench.owned``: the owned layout's figures (issue 39), through the library.

Two parts, each interleaved in one run (``bench.layout``'s rounds: a slice of every
cell per round, in a rotated order, so the shared machine's noise hits all alike):

* ``reads``: an owned datastore (by_user, by_time) per count of logical shards per
  server (``--per-server 8,256,2048``), each loaded with the same entities, and a raw
  baseline of **one table per server** (``<prefix>_raw.entities``: id and body, the
  same entities); get_many(100) of each datastore against the raw ``SELECT ... WHERE
  id IN (...)`` per server (servers in parallel, bodies decoded), and the scatter query
  (by_time, the newest page of 20) of each; median, p99 and the servers' CPU per
  operation.  Creating each datastore (``DataStore(..., shards=N)``) is timed: at
  2,048 per server on two servers, that is ``init`` with 4,096 logical shards.
* ``writes``: put (a new entity), update (an indexed value changed) and delete with 0,
  1 and 3 indexes, get and the equality query, owned against ``layout="databases"``
  (a database per logical shard) at ``--write-per-server``.  The equality query
  twice: ``query_eq`` of a user among all of them (one or two entities: the preload
  spreads about 800 over 500 users), and ``query_eq20`` of one of ``HEAVY`` users
  given ``HEAVY_EACH`` more entities each (a full page of 20).

Example: ``python -m bench.owned --entities 20000 --per-server 8,256,2048``; the
servers are started in ``.owned-cluster`` and stopped at the end.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from schemaless import DataStore, Index
from schemaless.hashing import shard_of
from schemaless.local import LocalCluster
from schemaless.schema import check_prefix

from .data import Dataset
from .env import RawClient, Servers, machine_info, set_server_globals
from .harness import write_results
from .layout import Cells, LayoutConfig, _measure
from .ops import BY_USER, INDEXES, PAGE, UPDATE_DELTA, raw_decode, raw_encode

__all__ = ["OwnedConfig", "drop", "format_markdown", "main", "run"]

BY_TIME = INDEXES["i3"][1]
PARTS = ("reads", "writes")
#: The users whose equality query fills a page (``query_eq20``), and their extra entities.
HEAVY, HEAVY_EACH = 10, 25


@dataclass
class OwnedConfig:
    """One run of the owned layout's benchmark."""

    entities: int = 20_000
    per_server: list[int] = field(default_factory=lambda: [8, 256, 2048])
    write_per_server: int = 8
    servers: int = 2
    rounds: int = 10
    slice_ops: int = 20
    prefix: str = "own"
    cluster_dir: str = ".owned-cluster"
    parts: list[str] = field(default_factory=lambda: list(PARTS))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _open(servers: Servers, prefix: str, shards: int, indexes: list[Index], **kw: Any) -> DataStore:
    return DataStore(
        list(servers.addresses),
        indexes,
        prefix=prefix,
        shards=shards,
        option_file=servers.option_file,
        refresh_interval=5.0,
        **kw,
    )


def _load(store: DataStore, ds: Dataset, stop: int, batch: int = 500) -> None:
    for start in range(0, stop, batch):
        store.put_many([ds.entity(i) for i in range(start, min(stop, start + batch))])


class RawTable:
    """The raw baseline: one ``entities`` table (id, body) per server."""

    def __init__(self, servers: Servers, prefix: str) -> None:
        self.raw = RawClient(servers)
        self.n = len(servers.addresses)
        self.table = f"`{prefix}_raw`.`entities`"  # the prefix is checked by ``run``
        for sid in range(self.n):
            self.raw.run(
                sid,
                f"CREATE DATABASE IF NOT EXISTS `{prefix}_raw`; CREATE TABLE IF NOT EXISTS"
                f" {self.table} (`id` BINARY(16) PRIMARY KEY, `body` MEDIUMBLOB) ENGINE=InnoDB",
            )

    def load(self, ds: Dataset, batch: int = 500) -> None:
        for start in range(0, ds.n, batch):
            per: dict[int, list[Any]] = {}
            for i in range(start, min(ds.n, start + batch)):
                e = ds.entity(i)
                per.setdefault(shard_of(e["id"], self.n), []).extend([e["id"], raw_encode(e)])
            for sid, params in per.items():
                marks = ", ".join(["(%s, %s)"] * (len(params) // 2))
                self.raw.run(sid, f"INSERT IGNORE INTO {self.table} VALUES {marks}", params)

    def get_many(self, keys: Sequence[bytes]) -> list[dict[str, Any] | None]:
        """One ``SELECT ... WHERE id IN (...)`` per server, servers in parallel."""
        by_sid: dict[int, list[bytes]] = {}
        for key in keys:
            by_sid.setdefault(shard_of(key, self.n), []).append(key)
        calls = {
            sid: (
                f"SELECT `id`, `body` FROM {self.table} WHERE `id` IN"
                f" ({', '.join(['%s'] * len(ks))})",
                ks,
            )
            for sid, ks in by_sid.items()
        }
        found = {
            bytes(k): raw_decode(b) for res in self.raw.fanout(calls).values() for k, b in res[0]
        }
        return [found.get(k) for k in keys]


def _reads(servers: Servers, cfg: OwnedConfig, ds: Dataset, pids: list[int]) -> dict[str, Any]:
    """get_many(100) and the scatter query at every size, and the raw table."""
    raw = RawTable(servers, cfg.prefix)
    raw.load(ds)
    indexes = [BY_USER, BY_TIME]
    stores: dict[int, DataStore] = {}
    init: dict[int, float] = {}
    for per in cfg.per_server:
        t = time.perf_counter()
        stores[per] = _open(servers, f"{cfg.prefix}_s{per}", per * cfg.servers, indexes)
        init[per] = round(time.perf_counter() - t, 2)
        _log(f"  {per} shards/server: created in {init[per]} s, loading {ds.n} entities")
        _load(stores[per], ds, ds.n)
    rng = random.Random(23)
    count = cfg.rounds * cfg.slice_ops
    items: dict[str, list[Any]] = {
        "get_many": [
            [ds.entity(rng.randrange(ds.n))["id"] for _ in range(100)] for _ in range(count)
        ],
        "scatter": [None] * count,
    }
    for keys in items["get_many"][:3]:  # every side reads the same entities
        want = raw.get_many(keys)
        assert all(s.get_many(keys) == want for s in stores.values()), "sides disagree"
    cells: Cells = {
        "get_many": {"raw": raw.get_many},
        "scatter": {},
    }
    for per, store in stores.items():
        cells["get_many"][f"owned {per}"] = store.get_many
        cells["scatter"][f"owned {per}"] = _scatter(store)
    out = _measure(cells, items, LayoutConfig(rounds=cfg.rounds, slice_ops=cfg.slice_ops), pids)
    for store in stores.values():
        store.close()
    raw.raw.close()
    return {"init_s": init, "ops": out}


def _scatter(store: DataStore) -> Callable[[Any], object]:
    return lambda _: store.query(BY_TIME, order="desc", limit=PAGE)


def _writes(servers: Servers, cfg: OwnedConfig, ds: Dataset, pids: list[int]) -> dict[str, Any]:
    """put/update/delete at 0, 1, 3 indexes, get and the equality query: owned
    against a database per logical shard, the same items on both."""
    count = cfg.rounds * cfg.slice_ops
    preload = 2 * count
    shards = cfg.write_per_server * cfg.servers
    stores = {
        (layout, kind): _open(
            servers, f"{cfg.prefix}_w{layout[0]}{kind}", shards, INDEXES[kind], layout=layout
        )
        for layout in ("owned", "databases")
        for kind in ("i0", "i1", "i3")
    }
    heavy = [ds.entity(ds.n + count + k) for k in range(HEAVY * HEAVY_EACH)]
    for k, e in enumerate(heavy):
        e["user_id"] = ds.user_id(k % HEAVY)
    for (layout, kind), store in stores.items():
        _log(f"  writes: loading {preload} + {len(heavy)} entities into {layout} {kind}")
        _load(store, ds, preload)
        store.put_many(heavy)
    updated = []
    for i in range(count):
        e = ds.entity(i)
        updated.append({**e, "published": e["published"] + UPDATE_DELTA})
    rng = random.Random(29)
    items = {
        "put": [ds.entity(ds.n + i) for i in range(count)],
        "update": updated,
        "delete": [ds.entity(count + i)["id"] for i in range(count)],
        "get": [ds.entity(rng.randrange(count))["id"] for _ in range(count)],
        "query_eq": [ds.user_id(rng.randrange(min(ds.users, preload))) for _ in range(count)],
        "query_eq20": [ds.user_id(rng.randrange(HEAVY)) for _ in range(count)],
    }
    cells: Cells = {}
    by_op: dict[str, list[Any]] = {}
    for (layout, kind), store in stores.items():
        n = kind[1]
        for op, call in (("put", store.put), ("update", store.put), ("delete", store.delete)):
            cells.setdefault(f"{op}_{n}idx", {})[layout] = call
            by_op[f"{op}_{n}idx"] = items[op]
        if kind == "i3":
            cells.setdefault("get", {})[layout] = store.get
            for op in ("query_eq", "query_eq20"):
                cells.setdefault(op, {})[layout] = _query_eq(store)
                by_op[op] = items[op]
            by_op["get"] = items["get"]
    out = _measure(cells, by_op, LayoutConfig(rounds=cfg.rounds, slice_ops=cfg.slice_ops), pids)
    for store in stores.values():
        store.close()
    return out


def _query_eq(store: DataStore) -> Callable[[Any], object]:
    return lambda user: store.query(BY_USER, user_id=user, order="desc", limit=PAGE)


def run(
    cfg: OwnedConfig, servers: Servers | None = None, pids: Sequence[int] = ()
) -> dict[str, Any]:
    """The whole benchmark; on a local cluster of its own (stopped at the end) unless
    ``servers`` is given (then the servers' CPU is that of ``pids``).  Its databases
    are dropped before and after."""
    cluster = None
    if servers is None:
        cluster = LocalCluster(Path(cfg.cluster_dir).absolute(), servers=cfg.servers).up()
        servers = Servers(tuple(cluster.addresses), str(cluster.option_file))
        pids = [p for p in (s.pid() for s in cluster.servers) if p is not None]
        set_server_globals(servers, None, 256)
    check_prefix(cfg.prefix)
    drop(servers, cfg.prefix)
    try:
        ds = Dataset(cfg.entities)
        out: dict[str, Any] = {
            "meta": {
                "config": asdict(cfg),
                "machine": machine_info(servers),
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
            }
        }
        if "reads" in cfg.parts:
            out["reads"] = _reads(servers, cfg, ds, list(pids))
        if "writes" in cfg.parts:
            out["writes"] = _writes(servers, cfg, ds, list(pids))
    finally:
        drop(servers, cfg.prefix)
        if cluster is not None:
            cluster.down()
    return out


def drop(servers: Servers, prefix: str) -> None:
    """Drop every database this benchmark makes under ``prefix`` (and only those)."""
    pattern = re.compile(rf"{re.escape(prefix)}_(?:raw|(?:s[0-9]+|w[od]i[013])_[a-z0-9]+)\Z")
    for i in range(len(servers.addresses)):
        names = [r[0] for r in servers.admin(i, "SHOW DATABASES") if pattern.match(r[0])]
        if names:
            servers.admin(i, ";".join(f"DROP DATABASE IF EXISTS `{n}`" for n in names))


def format_markdown(results: dict[str, Any]) -> str:
    """The results as Markdown tables: init times, reads (get_many against raw, the
    scatter query against the fewest shards per server), writes (owned against a
    database per logical shard)."""
    lines: list[str] = []
    reads = results.get("reads")
    if reads:
        lines += ["| shards/server | init s |", "|---|---|"]
        lines += [f"| {per} | {s:.2f} |" for per, s in reads["init_s"].items()]
        lines += ["", *_table(reads["ops"], {"get_many": "raw", "scatter": None})]
    if results.get("writes"):
        lines += ["", *_table(results["writes"], dict.fromkeys(results["writes"], "databases"))]
    return "\n".join(lines)


def _table(ops: dict[str, dict[str, Any]], bases: dict[str, str | None]) -> list[str]:
    lines = [
        "| operation | side | p50 ms | p99 ms | rounds' p50 min..max | vs | server CPU us/op |",
        "|---|---|---|---|---|---|---|",
    ]
    for op, by in ops.items():
        base = bases.get(op) or next(iter(by))
        for name, r in by.items():
            ratio = r["p50_ms"] / by[base]["p50_ms"]
            cpu = "" if r["server_cpu_us"] is None else f"{r['server_cpu_us']:.0f}"
            lines.append(
                f"| {op} | {name} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |"
                f" {r['round_p50_min_ms']:.2f}..{r['round_p50_max_ms']:.2f} |"
                f" {ratio:.2f}x {base} | {cpu} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.owned",
        description="the owned layout through the library (example: --per-server 8,256,2048)",
    )
    p.add_argument("--entities", type=int, default=20_000)
    p.add_argument("--per-server", default="8,256,2048", help="logical shards per server")
    p.add_argument("--write-per-server", type=int, default=8, help="shards/server of writes")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    p.add_argument("--slice-ops", type=int, default=20, help="ops per side per round")
    p.add_argument("--dir", default=".owned-cluster", help="local cluster directory")
    p.add_argument("--parts", default=",".join(PARTS), help="reads and/or writes")
    p.add_argument("--out", default=None, help="also write the JSON results here")
    a = p.parse_args(argv)
    cfg = OwnedConfig(
        entities=a.entities,
        per_server=[int(x) for x in a.per_server.split(",") if x.strip()],
        write_per_server=a.write_per_server,
        rounds=a.rounds,
        slice_ops=a.slice_ops,
        cluster_dir=a.dir,
        parts=[x for x in a.parts.split(",") if x.strip()],
    )
    results = run(cfg)
    results["meta"]["command"] = " ".join(["python -m bench.owned", *(argv or sys.argv[1:])])
    print(format_markdown(results))
    for path in write_results(results, a.out, "owned-"):
        print(f"results: {path}")


if __name__ == "__main__":
    main()
