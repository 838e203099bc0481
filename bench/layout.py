"""``python -m bench.layout``: the layout's tax (issue 23), measured per layout.

For each count of logical shards per server, every layout of ``bench.layouts`` is
loaded with the same entities; then get_many(100), the equality query and the scatter
query run over the same work items, layouts interleaved (a slice of each per round, in
a rotated order, so the shared machine's noise hits all alike): median and p99
latency, the spread of the rounds' medians, and the servers' CPU per operation (from
``/proc``, on the local cluster) and the client's.  Last, each layout moves two
logical shards (``bench.layoutmove``).  Every layout must return the same entities for
every item, or the run fails.

Example: ``python -m bench.layout --per-server 32,256`` (or ``make bench
BENCH_ARGS='--layout ...'``); the servers are started in ``.layout-cluster`` and
stopped at the end (``--keep`` keeps them and the data).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from schemaless.codec import Codec
from schemaless.local import LocalCluster
from schemaless.schema import check_prefix

from . import layoutwrites
from .data import Dataset
from .env import RawClient, Servers, machine_info, set_server_globals
from .harness import write_results
from .layoutmove import move_shard
from .layouts import CLASSES, LAYOUTS, TABLES, Layout, Placement, make_data
from .measure import percentile

__all__ = ["LayoutConfig", "format_markdown", "main", "run"]

OPS = ("get_many", "query_eq", "scatter")
PARTS = ("reads", "writes")  # reads: the read layouts and their moves


@dataclass
class LayoutConfig:
    """One run of the layout benchmark."""

    entities: int = 20_000
    per_server: list[int] = field(default_factory=lambda: [32, 256])
    servers: int = 2
    rounds: int = 15
    slice_ops: int = 20  # operations per layout per round
    hold: float = 0.3  # seconds another shard's transaction stays open during a fence
    prefix: str = "lay"
    cluster_dir: str = ".layout-cluster"
    keep: bool = False
    parts: list[str] = field(default_factory=lambda: list(PARTS))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of these processes (``/proc/<pid>/stat``)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def drop(servers: Servers, place: Placement, extra: Sequence[str] = ()) -> None:
    """Drop every database of ``place`` (and ``extra``) on every server."""
    for sid in range(len(servers.addresses)):
        names = {r[0] for r in servers.admin(sid, "SHOW DATABASES")}
        drops = [n for n in dict.fromkeys([*place.databases(), *extra]) if n in names]
        if drops:
            servers.admin(sid, ";".join(f"DROP DATABASE `{n}`" for n in drops))


def analyze(servers: Servers, place: Placement) -> None:
    """``ANALYZE TABLE`` every table of ``place`` (fresh statistics for every layout)."""
    dbs = ", ".join(f"'{n}'" for n in place.databases())  # names built from a checked prefix
    for sid in range(len(servers.addresses)):
        rows = servers.admin(
            sid,
            "SELECT table_schema, table_name FROM information_schema.tables"
            f" WHERE table_schema IN ({dbs})",
        )
        names = [f"`{db}`.`{table}`" for db, table in rows]
        for k in range(0, len(names), 100):
            servers.admin(sid, "ANALYZE TABLE " + ", ".join(names[k : k + 100]))


def _items(data_ids: list[bytes], users: list[bytes], count: int) -> dict[str, list[Any]]:
    rng = random.Random(23)
    return {
        "get_many": [rng.sample(data_ids, 100) for _ in range(count)],
        "query_eq": [rng.choice(users) for _ in range(count)],
        "scatter": [rng.choice(users) for _ in range(count)],
    }


def _call(layout: Layout, op: str) -> Callable[[Any], list[Any]]:
    calls: dict[str, Callable[[Any], list[Any]]] = {
        "get_many": layout.get_many,
        "query_eq": layout.query_eq,
        "scatter": layout.scatter,
    }
    return calls[op]


def _check_same(layouts: dict[str, Layout], items: dict[str, list[Any]], n: int) -> None:
    """Every layout returns the same entities for the first ``n`` items of each op."""
    for op in OPS:
        for item in items[op][:n]:
            got = {name: _call(layout, op)(item) for name, layout in layouts.items()}
            first = got[LAYOUTS[0]]
            if any(g != first for g in got.values()) or not any(first):
                raise AssertionError(f"layouts disagree (or find nothing) on {op}")


Cells = dict[str, dict[str, Callable[[Any], object]]]


def _measure(
    cells: Cells, items: dict[str, list[Any]], cfg: LayoutConfig, pids: list[int], skip: int = 0
) -> dict[str, dict[str, Any]]:
    """Interleaved slices: per cell and round, each layout runs ``slice_ops`` items
    (from item ``skip`` on), the layouts in a rotated order."""
    lat: dict[tuple[str, str], list[float]] = {}
    medians: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    pos = dict.fromkeys(cells, skip)
    for r in range(cfg.rounds):
        for op, calls in cells.items():
            batch = [items[op][(pos[op] + k) % len(items[op])] for k in range(cfg.slice_ops)]
            pos[op] += cfg.slice_ops
            names = list(calls)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                call = calls[name]
                times = []
                s0, c0 = _cpu_seconds(pids), time.process_time()
                for item in batch:
                    t = time.perf_counter()
                    call(item)
                    times.append(time.perf_counter() - t)
                s1, c1 = _cpu_seconds(pids), time.process_time()
                key = (op, name)
                lat.setdefault(key, []).extend(times)
                medians.setdefault(key, []).append(statistics.median(times))
                acc = cpu.setdefault(key, [0.0, 0.0])
                acc[0], acc[1] = acc[0] + s1 - s0, acc[1] + c1 - c0
    out: dict[str, dict[str, Any]] = {}
    for (op, name), times in lat.items():
        ts, ms = sorted(times), sorted(medians[(op, name)])
        out.setdefault(op, {})[name] = {
            "ops": len(ts),
            "p50_ms": round(1000 * percentile(ts, 50), 3),
            "p99_ms": round(1000 * percentile(ts, 99), 3),
            "round_p50_min_ms": round(1000 * ms[0], 3),
            "round_p50_max_ms": round(1000 * ms[-1], 3),
            "server_cpu_us": round(1e6 * cpu[(op, name)][0] / len(ts), 1) if pids else None,
            "client_cpu_us": round(1e6 * cpu[(op, name)][1] / len(ts), 1),
        }
    return out


def _moves(
    servers: Servers,
    raw: RawClient,
    places: dict[str, Placement],
    data_keys: dict[int, bytes],
    hold: float,
) -> list[dict[str, Any]]:
    """Each physical layout moves two shards of server 0 to server 1 (idle, then with
    another shard's transaction held open and a third shard probed)."""
    out = []
    for kind, place in places.items():
        on0 = place.shards_on(0)
        idle, busy, held, probed = on0[:4]
        for shard, load in ((idle, None), (busy, (held, probed, data_keys[probed], hold))):
            result = move_shard(servers, raw, kind, place, shard, 1, load)
            out.append(asdict(result))
            _log(f"  move {kind} shard {shard}: {result}")
    return out


def run_size(
    servers: Servers, cfg: LayoutConfig, per_server: int, pids: list[int]
) -> dict[str, Any]:
    """The parts of the run (``cfg.parts``) at ``per_server`` logical shards per server."""
    out: dict[str, Any] = {"per_server": per_server, "n_shards": per_server * cfg.servers}
    if "reads" in cfg.parts:
        out.update(_reads(servers, cfg, per_server, pids))
    if "writes" in cfg.parts:
        out["writes"] = _writes(servers, cfg, per_server, pids)
    return out


def _reads(servers: Servers, cfg: LayoutConfig, per_server: int, pids: list[int]) -> dict[str, Any]:
    """Load, measure the reads and move, every read layout."""
    n_shards = per_server * cfg.servers
    codec = Codec()
    data = make_data(Dataset(cfg.entities), n_shards, codec)
    prefix = check_prefix(f"{cfg.prefix}{per_server}")
    places = {
        kind: Placement(prefix, n_shards, cfg.servers) for kind in dict.fromkeys(TABLES.values())
    }
    raw = RawClient(servers)
    drop(servers, places["a"])
    layouts = {name: CLASSES[name](places[TABLES[name]], raw, codec) for name in LAYOUTS}
    load_s = {}
    try:
        first: dict[str, Layout] = {}
        for name, layout in layouts.items():
            first.setdefault(TABLES[name], layout)
        for kind, layout in first.items():
            t = time.perf_counter()
            layout.create()
            layout.load(data)
            load_s[kind] = round(time.perf_counter() - t, 2)
        analyze(servers, places["a"])
        _log(f"{per_server} shards per server: loaded {load_s}")
        items = _items([e[1] for e in data.entities], data.users, 400)
        _check_same(layouts, items, 5)
        for op in OPS:  # warm-up: connections, table caches, buffer pool
            for layout in layouts.values():
                for item in items[op][:10]:
                    _call(layout, op)(item)
        cells = {op: {n: _call(layout, op) for n, layout in layouts.items()} for op in OPS}
        ops = _measure(cells, items, cfg, pids)
        keys = {e[0]: e[1] for e in data.entities}
        moves = _moves(servers, raw, places, keys, cfg.hold)
        _check_same(layouts, items, 5)  # and after the moves, from the new places
    finally:
        raw.close()
        if not cfg.keep:
            drop(servers, places["a"])
    return {"load_s": load_s, "ops": ops, "moves": moves}


def _writes(
    servers: Servers, cfg: LayoutConfig, per_server: int, pids: list[int]
) -> dict[str, dict[str, Any]]:
    """Put, update and delete with 0, 1 and 3 indexes, today's layout against
    ``d_owned`` (``bench.layoutwrites``); both must hold the same rows at the end."""
    place = Placement(check_prefix(f"{cfg.prefix}w{per_server}"), per_server * cfg.servers,
                      cfg.servers)  # fmt: skip
    raw = RawClient(servers)
    extra = [layoutwrites.owned_db(place, guard) for guard in layoutwrites.GUARDS]
    drop(servers, place, extra)
    warm = 5
    try:
        t = time.perf_counter()
        cells, items, layouts = layoutwrites.cells(
            place, raw, Codec(), cfg.rounds * cfg.slice_ops, warm
        )
        _log(f"{per_server} shards per server: writes loaded in {time.perf_counter() - t:.1f} s")
        for op, calls in cells.items():  # warm-up
            for call in calls.values():
                for item in items[op][:warm]:
                    call(item)
        out = _measure(cells, items, cfg, pids, skip=warm)
        held = [layoutwrites.counts(layout) for layout in layouts]
        if any(h != held[0] for h in held):
            raise AssertionError(f"the write layouts hold different rows: {held}")
    finally:
        raw.close()
        if not cfg.keep:
            drop(servers, place, extra)
    return out


def run(
    cfg: LayoutConfig, servers: Servers | None = None, pids: list[int] | None = None
) -> dict[str, Any]:
    """The whole benchmark; starts (and stops) the cluster unless ``servers`` is given."""
    cluster = None
    if servers is None:
        cluster = LocalCluster(Path(cfg.cluster_dir).absolute(), servers=cfg.servers).up()
        servers = Servers(tuple(cluster.addresses), str(cluster.option_file))
        pids = [p for p in (s.pid() for s in cluster.servers) if p is not None]
        set_server_globals(servers, None, 512)
        for sid in range(cfg.servers):  # room for every table of the 256-shard layouts
            servers.admin(sid, "SET GLOBAL table_definition_cache = 8192, table_open_cache = 8192")
    try:
        meta = {
            "config": asdict(cfg),
            "machine": machine_info(servers),
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        sizes = [run_size(servers, cfg, n, pids or []) for n in cfg.per_server]
    finally:
        if cluster is not None and not cfg.keep:
            cluster.down()
    return {"meta": meta, "sizes": sizes}


def format_markdown(results: dict[str, Any]) -> str:
    """The results as Markdown tables: reads, moves, writes (those measured)."""
    sizes = results["sizes"]
    lines: list[str] = []
    if any("ops" in size for size in sizes):
        lines += _ops_table(sizes, "ops", "a_union")
    if any("moves" in size for size in sizes):
        lines += [
            "",
            "| shards/server | layout | shard | rows | copy s | fence s | held s | probe max ms"
            " | verify s | stale write | stale read |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for size in sizes:
            for m in size.get("moves", []):
                lines.append(
                    f"| {size['per_server']} | {m['kind']} | {m['shard']} | {m['rows']} |"
                    f" {m['copy_s']:.3f} | {m['fence_s']:.3f} | {m['held_s']:.1f} |"
                    f" {m['probe_max_ms']:.1f} | {m['verify_s']:.3f} | {m['stale_write']} |"
                    f" {m['stale_read']} |"
                )
    if any("writes" in size for size in sizes):
        lines += ["", *_ops_table(sizes, "writes", "today")]
    return "\n".join(lines).strip("\n")


def _ops_table(sizes: list[dict[str, Any]], part: str, base_name: str) -> list[str]:
    lines = [
        "| shards/server | operation | layout | p50 ms | p99 ms | rounds' p50 min..max"
        f" | vs {base_name} (p50) | server CPU us/op | client CPU us/op |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        for op, by in size.get(part, {}).items():
            base = by[base_name]["p50_ms"]
            for name, r in by.items():
                cpu = "" if r["server_cpu_us"] is None else f"{r['server_cpu_us']:.0f}"
                lines.append(
                    f"| {size['per_server']} | {op} | {name} | {r['p50_ms']:.2f} |"
                    f" {r['p99_ms']:.2f} | {r['round_p50_min_ms']:.2f}..{r['round_p50_max_ms']:.2f}"
                    f" | {r['p50_ms'] / base:.2f} | {cpu} | {r['client_cpu_us']:.0f} |"
                )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.layout",
        description="storage layouts' latency, CPU and moves (example: --per-server 32,256)",
    )
    p.add_argument("--entities", type=int, default=20_000)
    p.add_argument("--per-server", default="32,256", help="logical shards per server")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    p.add_argument("--slice-ops", type=int, default=20, help="ops per layout per round")
    p.add_argument("--hold", type=float, default=0.3, help="seconds held during a fence")
    p.add_argument("--dir", default=".layout-cluster", help="local cluster directory")
    p.add_argument("--prefix", default="lay", help="database prefix (its databases dropped)")
    p.add_argument("--parts", default=",".join(PARTS), help="reads and/or writes")
    p.add_argument("--keep", action="store_true", help="keep the servers and the data")
    p.add_argument("--out", default=None, help="also write the JSON results here")
    a = p.parse_args(argv)
    cfg = LayoutConfig(
        entities=a.entities,
        per_server=[int(x) for x in a.per_server.split(",") if x.strip()],
        rounds=a.rounds,
        slice_ops=a.slice_ops,
        hold=a.hold,
        prefix=a.prefix,
        cluster_dir=a.dir,
        keep=a.keep,
        parts=[x for x in a.parts.split(",") if x.strip()],
    )
    results = run(cfg)
    print(format_markdown(results))
    for path in write_results(results, a.out, "layout-"):
        print(f"results: {path}")


if __name__ == "__main__":
    main()
