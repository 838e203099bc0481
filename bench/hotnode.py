"""``python -m bench.hotnode``: the hot node, Facebook's "non-stored procedures" (issue 41).

``--threads`` (16) threads like one entry: ``Edges(ds, "likes", inverse="liked_by")
.add(user, entry)``, so the entry's ``liked_by`` count is the hot row, each side one
round trip (the edge and its count in one multi-statement transaction on the server).
Against it, the naive way through the same proxy with raw mysqlclient: per side START
TRANSACTION, INSERT the edge, UPDATE the count (an upsert), COMMIT, each a round trip,
so the count's row lock is held across the network until the COMMIT arrives.

Between clients and servers runs a delay proxy (a process of its own, a port per
mariadbd, one ``epoll`` loop) that holds every chunk ``--delay`` ms (1) each way, as
between racks; then the same without it.  The proxy is ``bench/delayproxy.c``, built
with gcc on first use into a cache dir (``proxy_binary``), so that it costs the
machine little CPU, as a network costs the database hosts none; ``--proxy python``
runs the former one in Python (``_Proxy``), ``--proxy c,python`` each in turn.
Within each, the sides alternate in slices (``run_interleaved``: A B B A per round),
so background load weighs on both alike, and a control runs each side with a new
entry per like (no hot row): how far each side is from what the machine allows it
anyway.  The hot counts are checked exact at the end (asserted: the entry's count
equals the likes made).  Last, each side's CPU a like, from /proc: this process (the
client), the proxy, the servers (their pids from the local cluster), and the likes/s
the machine's cores would allow at that cost.  Printed: adds/s and p99 per side, the
ratio, the CPU, the load average, the date and the commit.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import heapq
import itertools
import multiprocessing
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from schemaless import DataStore, Edges, new_id
from schemaless.local import LocalCluster

from .env import Servers, start_cluster
from .measure import run_interleaved, run_threads
from .provenance import load_average, provenance

__all__ = ["ProxyBuildError", "delay_proxy", "hot_node", "main", "proxy_binary"]

KINDS = ("liked_by", "likes")  # the naive tables: the hot side (server 0) first
PROXIES = ("c", "python")
CFLAGS = ("-O2", "-std=c11", "-Wall")


class ProxyBuildError(RuntimeError):
    """gcc is missing or could not build ``bench/delayproxy.c``."""


def proxy_binary() -> Path:
    """``bench/delayproxy.c`` built with gcc into ``$XDG_CACHE_HOME/schemaless-bench``
    (``~/.cache`` without it), once per version of the source; its path."""
    src = Path(__file__).with_name("delayproxy.c")
    key = hashlib.sha256(src.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "schemaless-bench"
    exe = cache / f"delayproxy-{key}"
    if exe.exists():
        return exe
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{exe.name}.{os.getpid()}.tmp"  # then renamed: builds may race
    try:
        done = subprocess.run(
            ["gcc", *CFLAGS, "-o", str(tmp), str(src)], capture_output=True, text=True
        )
    except FileNotFoundError as exc:
        raise ProxyBuildError(
            "gcc is not installed: it builds the delay proxy (make deps)"
        ) from exc
    if done.returncode:
        raise ProxyBuildError(f"gcc could not build {src}:\n{done.stderr.strip()}")
    os.replace(tmp, exe)
    return exe


class _Proxy:
    """TCP proxies in one loop: what a socket receives its peer sends on ``delay``
    seconds later, in order.  One ``epoll`` for readiness and one heap of due chunks;
    the wait is a ``select`` on the epoll's own descriptor, whose timeout has
    microseconds (an epoll timeout rounds up to whole milliseconds).  Chunks due
    together to one socket leave in one ``send``."""

    def __init__(self, delay: float) -> None:
        self.delay, self.epoll = delay, select.epoll()
        self.listeners: dict[int, tuple[socket.socket, str, int]] = {}
        self.socks: dict[int, socket.socket] = {}
        self.peer: dict[int, int] = {}  # each end's other end
        self.out: dict[int, bytearray] = {}  # what a socket could not take yet
        self.due: list[tuple[float, int, socket.socket, bytes]] = []  # b"": close
        self.seq = itertools.count()
        self.blocked: set[int] = set()  # sockets waiting for EPOLLOUT
        self.ended: set[int] = set()  # sockets that sent their end: unwatched

    def listen(self, target: str) -> str:
        """A listening socket in front of ``host:port``; its address."""
        host, _, port = target.rpartition(":")
        sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.listeners[sock.fileno()] = (sock, host, int(port))
        self.epoll.register(sock.fileno(), select.EPOLLIN)
        return f"127.0.0.1:{sock.getsockname()[1]}"

    def serve(self) -> None:
        """Forever: wait for a socket or the next due chunk, read, send what is due."""
        while True:
            wait = self.due[0][0] - time.monotonic() if self.due else None
            if (wait is None or wait > 0) and select.select([self.epoll], [], [], wait)[0]:
                for fd, events in self.epoll.poll(0):
                    self._ready(fd, events)
            now = time.monotonic()
            ready: dict[socket.socket, list[bytes]] = collections.defaultdict(list)
            while self.due and self.due[0][0] <= now:
                _, _, sock, data = heapq.heappop(self.due)
                ready[sock].append(data)
            for sock, chunks in ready.items():
                self._deliver(sock, chunks)

    def _ready(self, fd: int, events: int) -> None:
        if fd in self.listeners:
            self._accept(*self.listeners[fd])
            return
        if fd in self.socks and events & select.EPOLLOUT:
            self._flush(fd)
        if fd in self.socks and events & ~select.EPOLLOUT:
            self._read(fd)

    def _read(self, fd: int) -> None:
        """Hold what came for the peer; at the end, the peer's close (``b""``) and
        ``fd`` is no longer watched (what is still owed to it has nowhere to go)."""
        try:
            data = self.socks[fd].recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.ended.add(fd)
            self.epoll.unregister(fd)
        due = time.monotonic() + self.delay
        heapq.heappush(self.due, (due, next(self.seq), self.socks[self.peer[fd]], data))

    def _accept(self, listener: socket.socket, host: str, port: int) -> None:
        down, _ = listener.accept()
        try:
            up = socket.create_connection((host, port))
        except OSError:
            down.close()
            return
        for a, b in ((down, up), (up, down)):
            a.setblocking(False)
            a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks[a.fileno()], self.peer[a.fileno()] = a, b.fileno()
            self.out[a.fileno()] = bytearray()
            self.epoll.register(a.fileno(), select.EPOLLIN)

    def _deliver(self, sock: socket.socket, chunks: list[bytes]) -> None:
        fd = sock.fileno()  # -1 once closed (a number may be reused by then)
        if self.socks.get(fd) is not sock:
            return
        self.out[fd] += b"".join(chunks)
        self._flush(fd)
        if not chunks[-1]:
            self._close(fd)

    def _flush(self, fd: int) -> None:
        """Send what ``fd`` holds; what it cannot take yet waits for EPOLLOUT."""
        buf = self.out[fd]
        try:
            del buf[: self.socks[fd].send(buf)]
        except BlockingIOError:
            pass
        except OSError:
            self._close(fd)
            return
        if bool(buf) != (fd in self.blocked):
            self.blocked ^= {fd}
            self._watch(fd)

    def _watch(self, fd: int) -> None:
        """Read, and wait to write while ``fd`` holds data (until its end came)."""
        if fd not in self.ended:
            self.epoll.modify(fd, select.EPOLLIN | (select.EPOLLOUT if fd in self.blocked else 0))

    def _close(self, fd: int) -> None:
        for end in (fd, self.peer.get(fd)):
            if end is not None and end in self.socks:
                if end not in self.ended:
                    self.epoll.unregister(end)
                self.socks.pop(end).close()
                del self.peer[end], self.out[end]
                self.blocked.discard(end)
                self.ended.discard(end)


def serve_proxies(targets: list[str], delay: float, pipe: Any) -> None:
    """Run a proxy in front of each ``host:port`` target, holding every chunk ``delay``
    seconds each way; send their addresses down ``pipe``, then serve forever."""
    proxy = _Proxy(delay)
    pipe.send([proxy.listen(t) for t in targets])
    proxy.serve()


@contextlib.contextmanager
def delay_proxy(
    targets: Sequence[str], delay: float, kind: str = "c"
) -> Iterator[tuple[int, list[str]]]:
    """A delay proxy process (``kind``: "c", or "python" for ``_Proxy``) in front of
    each ``host:port`` target, holding every chunk ``delay`` seconds each way: its pid
    and its addresses, in the targets' order; killed at the end."""
    if kind == "python":
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=serve_proxies, args=(list(targets), delay, theirs))
        proc.start()
        try:
            yield proc.pid or 0, mine.recv()
        finally:
            proc.kill()
            proc.join()
        return
    argv = [str(proxy_binary()), str(round(delay * 1e6)), *targets]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as c:
        try:
            assert c.stdout is not None
            addresses = [c.stdout.readline().strip() for _ in targets]
            if not all(addresses):
                raise RuntimeError(f"the delay proxy exited ({c.wait()}): {argv}")
            yield c.pid, addresses
        finally:
            c.kill()


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


def cpu_seconds(pids: Sequence[int]) -> list[float]:
    """The CPU time (user and system, every thread) each process has used so far."""
    hz = os.sysconf("SC_CLK_TCK")
    stats = [Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() for pid in pids]
    return [(int(f[11]) + int(f[12])) / hz for f in stats]


def cpu_per_call(
    call: Callable[[Any], object],
    items: Iterator[Any],
    threads: int,
    seconds: float,
    groups: Mapping[str, Sequence[int]],
) -> dict[str, float]:
    """Milliseconds of CPU one call costs each group of processes (``client``: this
    one, the proxy, the servers), over ``seconds`` of ``threads`` calling."""
    pids = [pid for group in groups.values() for pid in group]
    before = cpu_seconds(pids)
    ops = max(1, run_threads(call, items, threads, seconds).ops)
    spent = {p: b - a for p, a, b in zip(pids, before, cpu_seconds(pids), strict=True)}
    return {name: round(1000 * sum(spent[p] for p in g) / ops, 3) for name, g in groups.items()}


def hot_node(
    servers: Servers,
    prefix: str,
    threads: int,
    seconds: float,
    delay_ms: float,
    rounds: int = 3,
    server_pids: Sequence[int] = (),
    proxy: str = "c",
) -> dict[str, Any]:
    """Adds/s of ``Edges.add`` and of the naive way on one hot entry and, as a control,
    on a new entry per like, ``seconds`` each side in ``rounds`` interleaved rounds,
    through a ``proxy`` (``delay_proxy``) adding ``delay_ms`` each way (none at 0).
    Asserts the hot counts exact.  Then each side's CPU a like (``cpu_per_call`` on
    new entries, a slice each): this process, the proxy and ``server_pids``."""
    with contextlib.ExitStack() as stack:
        proxy_pids, via = [], servers
        if delay_ms > 0:
            pid, addresses = stack.enter_context(
                delay_proxy(servers.addresses, delay_ms / 1000, proxy)
            )
            proxy_pids, via = [pid], Servers(tuple(addresses), servers.option_file)
        tag = f"{int(delay_ms * 1000)}us" + (f"_{proxy}" if proxy_pids else "")
        create_naive(servers, f"{prefix}_tl_hotraw_{tag}")
        naive = Naive(via, f"{prefix}_tl_hotraw_{tag}")
        stack.callback(naive.close)
        ds = DataStore(
            list(via.addresses),
            prefix=f"{prefix}_tl_hot_{tag}",
            shards=16,
            option_file=servers.option_file,
            pool_size=threads + 4,
        )
        stack.callback(ds.close)
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
        out["proxy"] = proxy if delay_ms > 0 else None
        for name, sample in samples.items():
            s = sample.summary()
            assert not sample.errors, f"{name}: {sample.first_error}"
            out[name] = {"per_s": s["throughput"], "p99_ms": s["p99_ms"], "ops": s["ops"]}
        exact = {"naive": naive.count(0), "Edges.add": likes.count_inverse(entry)}
        for name, n in exact.items():
            assert n == out[name]["ops"], f"{name}: count {n}, {out[name]['ops']} likes made"
            out[name]["exact"] = True
        out["ratio"] = round(out["Edges.add"]["per_s"] / out["naive"]["per_s"], 2)
        groups = {"client": [os.getpid()], "proxy": proxy_pids, "servers": list(server_pids)}
        for side in ("naive", "Edges.add"):
            call, items = calls[f"{side}, no hot row"]
            out[side]["cpu_ms"] = cpu_per_call(call, items, threads, seconds / rounds, groups)
        return out


def format_rows(results: list[dict[str, Any]]) -> str:
    """A markdown table of ``hot_node`` results; "CPU bound": the likes/s this
    machine's cores allow at that CPU a like, with nothing else running."""
    lines = [
        "| added each way | side | adds/s (hot entry) | p99 ms | adds/s (no hot row)"
        " | Edges/naive | CPU ms a like: client / proxy / servers | CPU bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for side in ("naive", "Edges.add"):
            ratio = f"{r['ratio']}x" if side == "Edges.add" else ""
            hot, cold, cpu = r[side], r[f"{side}, no hot row"], r[side]["cpu_ms"]
            bound = 1000 * (os.cpu_count() or 1) / max(sum(cpu.values()), 1e-9)
            via = f" ({r['proxy']} proxy)" if r.get("proxy") else ""
            lines.append(
                f"| {r['delay_ms']:g} ms{via} | {side} | {hot['per_s']:.0f} | {hot['p99_ms']:.1f}"
                f" | {cold['per_s']:.0f} | {ratio} | {cpu['client']:.2f} / {cpu['proxy']:.2f}"
                f" / {cpu['servers']:.2f} | {bound:.0f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from .harness import drop_prefix

    p = argparse.ArgumentParser(prog="python -m bench.hotnode", description=__doc__)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--seconds", type=float, default=6.0, help="per side and delay")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--delay", type=float, default=1.0, help="ms added each way")
    p.add_argument("--proxy", default="c", help="c, python, or both in turn (c,python)")
    p.add_argument("--dir", default=".bench-cluster")
    p.add_argument("--prefix", default="bench")
    a = p.parse_args(argv)
    proxies = a.proxy.split(",")
    if not set(proxies) <= set(PROXIES):
        p.error(f"--proxy: {a.proxy!r}: not c, python or both (c,python)")
    try:
        if "c" in proxies:
            proxy_binary()
    except ProxyBuildError as exc:
        raise SystemExit(f"bench.hotnode: {exc}") from exc
    servers = start_cluster(a.dir, 2, durable=True)
    pids = [int(s["pid"]) for s in LocalCluster(a.dir).status() if s["pid"] is not None]
    drop_prefix(servers, a.prefix)
    before = load_average()
    try:
        results = [
            hot_node(servers, a.prefix, a.threads, a.seconds, delay, a.rounds, pids, proxy)
            for delay, proxy in [(a.delay, x) for x in proxies] + [(0.0, "c")]
        ]
    finally:
        drop_prefix(servers, a.prefix)
    print(format_rows(results))
    print(f"{provenance(argv)}; load average before {before}, after {load_average()}")


if __name__ == "__main__":
    main()
