"""``bench.hotnode``'s delay proxy in C (``bench/delayproxy.c``): built by gcc on first
use, it holds each chunk the delay each way, keeps every connection's bytes whole and
in order, and passes a close on; against a real mariadbd and a local echo server."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until

import bench.hotnode
from bench.env import Servers
from bench.hotnode import ProxyBuildError, delay_proxy, main, proxy_binary
from schemaless.local import LocalCluster
from schemaless.wire import read_results


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    """A local echo server (a thread a connection) that closes when its client's
    close arrives; its address."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_all(sock: socket.socket) -> bytes:
    """What ``sock`` receives until its peer's close."""
    got = bytearray()
    while data := sock.recv(1 << 20):
        got += data
    return bytes(got)


def test_a_round_trip_through_it_takes_the_delay_twice_against_mariadbd(
    local_cluster: LocalCluster,
) -> None:
    """Through the C proxy, a ``SELECT`` takes 2 ms each way more than direct (its
    minimum of 20 under 3 ms more: the timer has microseconds); a reply of many
    chunks comes whole and in order; a client's close reaches the server."""
    servers = Servers(tuple(local_cluster.addresses), str(local_cluster.option_file))
    with delay_proxy(servers.addresses, 0.002) as (pid, addresses):
        assert pid > 0 and len(addresses) == 2
        via = Servers(tuple(addresses), servers.option_file)
        db, direct = via.connect(1), servers.connect(1)

        def least(conn: Any, n: int = 20) -> float:
            took = []
            for i in range(n):
                began = time.perf_counter()
                conn.query(f"SELECT {i}")
                assert conn.store_result().fetch_row() == ((i,),)
                took.append(time.perf_counter() - began)
            return min(took)

        added = least(db) - least(direct)
        assert 0.004 <= added < 0.007
        db.query("SELECT 1; SELECT REPEAT('x', 300000); SELECT 3")  # chunks of 64 KiB
        assert read_results(db, None) == [((1,),), (("x" * 300000,),), ((3,),)]
        db.query("SELECT CONNECTION_ID()")
        conn_id = db.store_result().fetch_row()[0][0]
        db.close()
        direct.close()
        listed = "SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s"
        assert wait_until(lambda: servers.admin(1, listed, (conn_id,))[0][0] == 0)


def test_many_connections_get_their_bytes_whole_and_in_order(echo: str) -> None:
    """Sixteen connections at once each send 1 MB of random bytes (larger than the
    socket buffers, so sends block) and half-close: each gets its own bytes back, in
    order, and then the close (the echo server's, passed on after the delay)."""
    with delay_proxy([echo], 0.001) as (_, (address,)):
        blobs = [os.urandom(1 << 20) for _ in range(16)]
        got: list[bytes] = [b""] * len(blobs)

        def one(i: int) -> None:
            with _connect(address) as sock:
                writer = threading.Thread(target=sock.sendall, args=(blobs[i],))
                writer.start()
                reader = threading.Thread(target=lambda: got.__setitem__(i, _recv_all(sock)))
                reader.start()
                writer.join()
                sock.shutdown(socket.SHUT_WR)
                reader.join(timeout=30)

        workers = [threading.Thread(target=one, args=(i,)) for i in range(len(blobs))]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
        assert [len(g) for g in got] == [len(b) for b in blobs]
        assert got == blobs


def test_an_echo_takes_the_delay_twice_and_a_zero_delay_proxy_passes_through(
    echo: str,
) -> None:
    """One byte to the echo server and back: at least twice the delay through it, and
    under 2 ms more than twice at its quickest; at 0 it adds under 1.5 ms."""

    def least(address: str, n: int = 30) -> float:
        with _connect(address) as sock:
            took = []
            for _ in range(n):
                began = time.perf_counter()
                sock.sendall(b"x")
                assert sock.recv(16) == b"x"
                took.append(time.perf_counter() - began)
        return min(took)

    with delay_proxy([echo], 0.003) as (_, (address,)):
        assert 0.006 <= least(address) < 0.008
    with delay_proxy([echo], 0.0) as (_, (address,)):
        assert least(address) < 0.0015


def test_it_exits_when_its_parent_closes_its_stdin() -> None:
    """The proxy lives as long as the pipe to its stdin: a parent that dies without
    killing it leaves no proxy behind."""
    proc = subprocess.Popen(
        [str(proxy_binary()), "1000", "127.0.0.1:1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().startswith("127.0.0.1:")
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    proc.stdout.close()


def test_it_is_built_once_into_the_cache_and_a_failed_build_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built into ``$XDG_CACHE_HOME/schemaless-bench`` once (the second call builds
    nothing); gcc's own message when it fails, a clear one when it is missing; the
    bench stops on either before it starts a server."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    exe = proxy_binary()
    assert exe.parent == tmp_path / "schemaless-bench" and os.access(exe, os.X_OK)
    built = exe.stat().st_mtime_ns
    assert proxy_binary() == exe and exe.stat().st_mtime_ns == built
    monkeypatch.setattr(bench.hotnode, "CFLAGS", ("-include", "oops-no-such.h"))
    with pytest.raises(ProxyBuildError, match=r"gcc could not build .*delayproxy\.c:\n.*oops"):
        proxy_binary()
    with pytest.raises(SystemExit, match=r"bench\.hotnode: gcc could not build"):
        main(["--dir", str(tmp_path / "never")])
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(bench.hotnode, "CFLAGS", ("-O1",))
    with pytest.raises(ProxyBuildError, match="gcc is not installed"):
        proxy_binary()
    assert not (tmp_path / "never").exists()
    assert sorted(p.name for p in exe.parent.iterdir()) == [exe.name]


def test_an_unknown_proxy_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--proxy", "c,rust"])
    assert exc.value.code == 2
    assert "--proxy: 'c,rust': not c, python or both" in capsys.readouterr().err
