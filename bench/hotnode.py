"""``python -m bench.hotnode``: the hot node, Facebook's "non-stored procedures" (issue 41).

``--threads`` (16) threads like one entry: ``Edges(ds, "likes", inverse="liked_by")
.add(user, entry)``, so the entry's ``liked_by`` count is the hot row, each side one
round trip (the edge and its count in one multi-statement transaction on the server).
Against it, the naive way through the same proxy with raw mysqlclient: per side START
TRANSACTION, INSERT the edge, UPDATE the count (an upsert), COMMIT, each a round trip,
so the count's row lock is held across the network until the COMMIT arrives.

Between clients and servers runs a delay proxy: an asyncio TCP proxy (a process of its
own, a port per mariadbd; protocols and timers, so a chunk costs it one callback) that
holds every chunk ``--delay`` ms (1) each way, as between racks; then the same without
it.  Within each, the sides alternate in slices
(``run_interleaved``: A B B A per round), so background load weighs on both alike, and
a control runs each side with a new entry per like (no hot row): how far each side is
from what the machine allows it anyway.  The hot counts are checked exact at the end
(asserted: the entry's count equals the likes made).  Printed: adds/s and p99 per side,
the ratio, the load average, the date and the commit.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

from schemaless import DataStore, Edges, new_id

from .env import Servers, start_cluster
from .measure import run_interleaved
from .provenance import load_average, provenance

__all__ = ["hot_node", "main"]

KINDS = ("liked_by", "likes")  # the naive tables: the hot side (server 0) first


class _Half(asyncio.Protocol):
    """One end of a proxied connection: what it receives is written to the other
    end's transport ``delay`` seconds later, in order (timers at increasing times)."""

    def __init__(
        self, delay: float, dial: Callable[[_Half], Coroutine[Any, Any, None]] | None = None
    ):
        self.delay, self.dial, self.last = delay, dial, 0.0
        self.transport: asyncio.WriteTransport | None = None
        self.peer: asyncio.WriteTransport | None = None
        self.early: list[bytes] = []  # what arrived before the other end connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport
        if self.dial is not None:
            asyncio.get_running_loop().create_task(self.dial(self))

    def pair(self, other: _Half) -> None:
        self.peer = other.transport
        for data in self.early:
            self._later(data)

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early.append(data)
        else:
            self._later(data)

    def _later(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        self.last = max(loop.time() + self.delay, self.last + 1e-6)
        assert self.peer is not None
        loop.call_at(self.last, self.peer.write, data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:  # closed once what it still holds is written
            asyncio.get_running_loop().call_at(self.last + 1e-6, self.peer.close)


def serve_proxies(targets: list[str], delay: float, pipe: Any) -> None:
    """Run TCP proxies, one per ``host:port`` target, each holding every chunk
    ``delay`` seconds each way; sends their addresses down ``pipe``, then serves forever.
    Protocols and timers, not streams: a chunk costs the proxy one callback."""

    def accept(target: str) -> Callable[[], asyncio.Protocol]:
        host, _, port = target.rpartition(":")

        async def dial(down: _Half) -> None:
            loop = asyncio.get_running_loop()
            try:
                _, up = await loop.create_connection(lambda: _Half(delay), host, int(port))
            except OSError:
                assert down.transport is not None
                down.transport.close()
                return
            up.pair(down)
            down.pair(up)

        return lambda: _Half(delay, dial)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        started = [await loop.create_server(accept(t), "127.0.0.1", 0) for t in targets]
        pipe.send([f"127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in started])
        await asyncio.Event().wait()

    asyncio.run(serve())


def create_naive(servers: Servers, db: str) -> None:
    """The naive tables: ``liked_by`` (and its counts) on server 0, ``likes`` on 1."""
    for i, kind in enumerate(KINDS):
        servers.admin(
            i % len(servers.addresses),
            f"CREATE DATABASE IF NOT EXISTS `{db}`;"
            f"CREATE TABLE `{db}`.`{kind}` (`src` BIGINT, `dst` BIGINT,"
            " PRIMARY KEY (`src`, `dst`)) ENGINE=InnoDB;"
            f"CREATE TABLE `{db}`.`{kind}_n` (`node` BIGINT PRIMARY KEY, `n` BIGINT)"
            " ENGINE=InnoDB",
        )


class Naive:
    """Likes the naive way: per side four round trips, the count locked across two."""

    def __init__(self, servers: Servers, db: str) -> None:
        self.servers, self.db, self.local = servers, db, threading.local()

    def add(self, user: int, entry: int) -> None:
        if not hasattr(self.local, "conns"):
            self.local.conns = [self.servers.connect(i) for i in range(len(KINDS))]
        for conn, kind, node, other in zip(
            self.local.conns, KINDS, (entry, user), (user, entry), strict=True
        ):
            cur = conn.cursor()
            cur.execute("START TRANSACTION")
            cur.execute(f"INSERT IGNORE INTO `{self.db}`.`{kind}` VALUES (%s, %s)", (node, other))
            if cur.rowcount:
                cur.execute(
                    f"INSERT INTO `{self.db}`.`{kind}_n` VALUES (%s, 1)"
                    " ON DUPLICATE KEY UPDATE `n` = `n` + 1",
                    (node,),
                )
            cur.execute("COMMIT")

    def count(self, entry: int) -> int:
        rows = self.servers.admin(
            0, f"SELECT `n` FROM `{self.db}`.`liked_by_n` WHERE `node` = %s", (entry,)
        )
        return int(rows[0][0]) if rows else 0

    def close(self) -> None:
        for conn in getattr(self.local, "conns", ()):
            conn.close()


def hot_node(
    servers: Servers,
    prefix: str,
    threads: int,
    seconds: float,
    delay_ms: float,
    rounds: int = 3,
) -> dict[str, Any]:
    """Adds/s of ``Edges.add`` and of the naive way on one hot entry and, as a control,
    on a new entry per like, ``seconds`` each side in ``rounds`` interleaved rounds,
    through proxies adding ``delay_ms`` each way (none at 0).  Asserts the hot counts
    exact."""
    proc, via = None, servers
    if delay_ms > 0:
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = ctx.Pipe()
        targets = list(servers.addresses)
        proc = ctx.Process(target=serve_proxies, args=(targets, delay_ms / 1000, theirs))
        proc.start()
        via = Servers(tuple(mine.recv()), servers.option_file)
    tag = f"{int(delay_ms * 1000)}us"
    create_naive(servers, f"{prefix}_tl_hotraw_{tag}")
    naive = Naive(via, f"{prefix}_tl_hotraw_{tag}")
    ds = DataStore(
        list(via.addresses),
        prefix=f"{prefix}_tl_hot_{tag}",
        shards=16,
        option_file=servers.option_file,
        pool_size=threads + 4,
    )
    try:
        likes = Edges(ds, "likes", inverse="liked_by")
        entry, users = new_id(), itertools.count(1)
        calls: dict[str, tuple[Callable[[Any], object], Iterator[Any]]] = {
            "naive": (lambda u: naive.add(u, 0), users),
            "Edges.add": (lambda _: likes.add(new_id(), entry), itertools.count()),
            "naive, no hot row": (lambda u: naive.add(u, -u), users),
            "Edges.add, no hot row": (lambda _: likes.add(new_id(), new_id()), itertools.count()),
        }
        samples = run_interleaved(calls, threads, seconds, rounds)
        out: dict[str, Any] = {"delay_ms": delay_ms, "threads": threads}
        for name, sample in samples.items():
            s = sample.summary()
            assert not sample.errors, f"{name}: {sample.first_error}"
            out[name] = {"per_s": s["throughput"], "p99_ms": s["p99_ms"], "ops": s["ops"]}
        exact = {"naive": naive.count(0), "Edges.add": likes.count_inverse(entry)}
        for name, n in exact.items():
            assert n == out[name]["ops"], f"{name}: count {n}, {out[name]['ops']} likes made"
            out[name]["exact"] = True
        out["ratio"] = round(out["Edges.add"]["per_s"] / out["naive"]["per_s"], 2)
        return out
    finally:
        ds.close()
        naive.close()
        if proc is not None:
            proc.kill()
            proc.join()


def format_rows(results: list[dict[str, Any]]) -> str:
    """A markdown table of ``hot_node`` results."""
    lines = [
        "| added each way | side | adds/s (hot entry) | p99 ms | adds/s (no hot row)"
        " | Edges/naive |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for side in ("naive", "Edges.add"):
            ratio = f"{r['ratio']}x" if side == "Edges.add" else ""
            hot, cold = r[side], r[f"{side}, no hot row"]
            lines.append(
                f"| {r['delay_ms']:g} ms | {side} | {hot['per_s']:.0f} | {hot['p99_ms']:.1f}"
                f" | {cold['per_s']:.0f} | {ratio} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from .harness import drop_prefix

    p = argparse.ArgumentParser(prog="python -m bench.hotnode", description=__doc__)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--seconds", type=float, default=6.0, help="per side and delay")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--delay", type=float, default=1.0, help="ms added each way")
    p.add_argument("--dir", default=".bench-cluster")
    p.add_argument("--prefix", default="bench")
    a = p.parse_args(argv)
    servers = start_cluster(a.dir, 2, durable=True)
    drop_prefix(servers, a.prefix)
    before = load_average()
    try:
        results = [
            hot_node(servers, a.prefix, a.threads, a.seconds, delay, a.rounds)
            for delay in (a.delay, 0.0)
        ]
    finally:
        drop_prefix(servers, a.prefix)
    print(format_rows(results))
    print(f"{provenance(argv)}; load average before {before}, after {load_average()}")


if __name__ == "__main__":
    main()
