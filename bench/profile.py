"""``python -m bench.profile``: where the client time of each operation goes.

For each operation, single-threaded: wall time and client CPU time (process time, which
includes the library's fan-out threads) per call, for schemaless and raw; the
difference of CPU per call is the library's Python overhead.  With ``--cprofile OP``
the schemaless side of that operation also runs under cProfile and the top functions
are printed.

Example: ``python -m bench.profile --entities 20000 --cprofile put_3idx``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import pstats
import time
from typing import Any

from .data import Dataset
from .harness import drop_prefix
from .ops import Bench, Op, operations

__all__ = ["cpu_split", "main"]


def cpu_split(op: Op, n: int) -> dict[str, Any]:
    """Per call, single-threaded: wall and client CPU microseconds of both sides."""
    items = op.items(1, n + 20 if op.write else 0)
    out: dict[str, Any] = {"op": op.name}
    for side, call, pick in (("schemaless", op.sl, 0), ("raw", op.raw, 1)):
        xs = [item[pick] for item in items]
        source = itertools.cycle(xs) if op.cycle else iter(xs)
        for _ in range(10):  # warm-up
            call(next(source))
        count = n if op.cycle else min(n, len(xs) - 10)
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(count):
            call(next(source))
        if pick == 0 and op.settle is not None:
            op.settle()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        out[side] = {"wall_us": round(wall / count * 1e6, 1), "cpu_us": round(cpu / count * 1e6, 1)}
    out["extra_cpu_us"] = round(out["schemaless"]["cpu_us"] - out["raw"]["cpu_us"], 1)
    out["extra_wall_us"] = round(out["schemaless"]["wall_us"] - out["raw"]["wall_us"], 1)
    return out


def profile_op(op: Op, n: int, top: int = 30) -> str:
    """cProfile of the schemaless side of ``op``, ``n`` calls."""
    items = op.items(1, n if op.write else 0)
    xs = [s for s, _ in items]
    source = itertools.cycle(xs) if op.cycle else iter(xs)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n if op.cycle else len(xs)):
        op.sl(next(source))
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main() -> None:
    from .env import start_cluster

    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    p.add_argument("--entities", type=int, default=20000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--dir", default=".bench-cluster")
    p.add_argument("--prefix", default="benchprof")
    p.add_argument("--ops", default=None, help="comma-separated (default: all)")
    p.add_argument("--cprofile", default=None, help="profile this operation's schemaless side")
    a = p.parse_args()
    servers = start_cluster(a.dir)
    drop_prefix(servers, a.prefix)
    b = Bench.create(servers, a.prefix, a.shards, Dataset(a.entities))
    try:
        b.create_raw_tables()
        b.load(0, a.entities)
        wanted = a.ops.split(",") if a.ops else None
        ops = [op for op in operations(b) if wanted is None or op.name in wanted]
        print(f"{'op':<16} {'sl wall':>8} {'sl cpu':>8} {'raw wall':>8} {'raw cpu':>8} "
              f"{'+cpu':>7} {'+wall':>7}  (microseconds per call, 1 thread)")  # fmt: skip
        for op in ops:
            r = cpu_split(op, a.calls)
            sl, raw = r["schemaless"], r["raw"]
            print(
                f"{op.name:<16} {sl['wall_us']:>8} {sl['cpu_us']:>8} {raw['wall_us']:>8} "
                f"{raw['cpu_us']:>8} {r['extra_cpu_us']:>7} {r['extra_wall_us']:>7}"
            )
            if a.cprofile == op.name:
                print(profile_op(op, a.calls))
    finally:
        b.close()
        drop_prefix(servers, a.prefix)


if __name__ == "__main__":
    main()
