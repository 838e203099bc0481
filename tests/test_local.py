"""The local cluster manager, against real mariadbd processes."""

from __future__ import annotations

import configparser
import json
import logging
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import MySQLdb
import pytest

import schemaless.local.server as local_server
from schemaless.local import LocalCluster, LocalClusterError, default_base_dir


def connect(cluster: LocalCluster, i: int, **kwargs: Any) -> Any:
    """A connection as the application user, the way the library makes them."""
    return MySQLdb.connect(
        host="127.0.0.1",
        port=cluster.servers[i].port,
        read_default_file=str(cluster.option_file),
        read_default_group="client",
        connect_timeout=5,
        **kwargs,
    )


def query(cluster: LocalCluster, i: int, sql: str) -> tuple[tuple[Any, ...], ...]:
    conn = connect(cluster, i)
    try:
        cur = conn.cursor()
        cur.execute(sql)
        rows: tuple[tuple[Any, ...], ...] = cur.fetchall()
        return rows
    finally:
        conn.close()


def password_of(cluster: LocalCluster) -> str:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(cluster.option_file)
    return parser["client"]["password"]


# -- the session cluster --------------------------------------------------------------


def test_session_cluster_runs_two_servers(local_cluster: LocalCluster) -> None:
    assert len(local_cluster.servers) == 2
    assert all(s.running() for s in local_cluster.servers)
    ports = [s.port for s in local_cluster.servers]
    assert len(set(ports)) == 2
    assert local_cluster.addresses == [f"127.0.0.1:{p}" for p in ports]
    status = local_cluster.status()
    assert [row["index"] for row in status] == [0, 1]
    assert all(row["running"] and isinstance(row["pid"], int) for row in status)


def test_option_file_connects_to_strict_utf8_mariadb(local_cluster: LocalCluster) -> None:
    for i in range(2):
        ((version, user, flush, sql_mode, charset, collation),) = query(
            local_cluster,
            i,
            "SELECT @@version, CURRENT_USER(), @@innodb_flush_log_at_trx_commit,"
            " @@sql_mode, @@character_set_server, @@collation_server",
        )
        assert "MariaDB" in version
        assert user == "schemaless@127.0.0.1"
        assert flush == 2  # durable=False
        assert "STRICT_TRANS_TABLES" in sql_mode.split(",")
        assert (charset, collation) == ("utf8mb4", "utf8mb4_nopad_bin")


def test_up_on_a_running_cluster_is_a_noop(local_cluster: LocalCluster) -> None:
    before = [(s.port, s.pid()) for s in local_cluster.servers]
    again = LocalCluster(local_cluster.base_dir, servers=2, durable=False)
    assert [s.port for s in again.servers] == [port for port, _ in before]  # known from state
    t0 = time.monotonic()
    again.up()
    assert time.monotonic() - t0 < 2.0
    assert [(s.port, s.pid()) for s in again.servers] == before
    assert again.addresses == local_cluster.addresses


# -- a private one-server cluster for fault injection ---------------------------------


@dataclass
class Solo:
    cluster: LocalCluster
    up_seconds: float
    log_lines: list[str] = field(default_factory=list)


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(self.format(record))


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Solo]:
    # Deep on purpose: the socket path is then too long for AF_UNIX and must move.
    base = tmp_path_factory.mktemp("solo") / ("deep-" + "d" * 60)
    lines: list[str] = []
    logger = logging.getLogger("schemaless.local")
    handler, old_level = _Collect(lines), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        cluster = LocalCluster(base, servers=1, durable=True)
        t0 = time.monotonic()
        cluster.up()
        up_seconds = time.monotonic() - t0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    yield Solo(cluster, up_seconds, lines)
    cluster.down()
    LocalCluster(base).down()  # also what test_grow added


def test_solo_layout_and_settings(solo: Solo) -> None:
    cluster = solo.cluster
    assert solo.up_seconds < 30
    base = cluster.base_dir
    state = json.loads((base / "cluster.json").read_text())
    assert state["durable"] is True
    assert [e["port"] for e in state["servers"]] == [cluster.servers[0].port]
    assert stat.S_IMODE(cluster.option_file.stat().st_mode) == 0o600
    server = cluster.servers[0]
    for path in (server.datadir, server.pidfile, server.logfile, base / "server0" / "my.cnf"):
        assert path.exists(), path
    # The socket moved out of the deep directory, and it works (root made the user there).
    assert len(str(server.socket)) <= 100
    assert server.socket.is_socket()
    ((flush, max_conn),) = query(
        cluster, 0, "SELECT @@innodb_flush_log_at_trx_commit, @@max_connections"
    )
    assert (flush, max_conn) == (1, 400)


def test_password_never_leaks(solo: Solo, caplog: pytest.LogCaptureFixture) -> None:
    cluster = solo.cluster
    password = password_of(cluster)
    assert len(password) >= 20
    caplog.set_level(logging.DEBUG, logger="schemaless.local")
    cluster.stop_server(0)
    cluster.start_server(0)
    cluster.up()
    seen = [
        repr(cluster),
        repr(cluster.servers),
        str(cluster.status()),
        caplog.text,
        "\n".join(solo.log_lines),
    ]
    assert solo.log_lines and caplog.text  # something was logged at all
    for text in seen:
        assert password not in text
    # Nowhere on disk but client.cnf (not in my.cnf, logs, state, data files).
    for path in cluster.base_dir.rglob("*"):
        if path.is_file() and path != cluster.option_file:
            assert password.encode() not in path.read_bytes(), path


def test_pause_makes_queries_time_out_until_resume(solo: Solo) -> None:
    cluster = solo.cluster
    cluster.up()
    conn = connect(cluster, 0, read_timeout=2)
    try:
        cur = conn.cursor()
        cur.execute("SELECT 1")
        cluster.pause_server(0)
        try:
            t0 = time.monotonic()
            with pytest.raises(MySQLdb.OperationalError):
                cur.execute("SELECT 1")
            assert 1.5 < time.monotonic() - t0 < 10
            assert cluster.servers[0].pid() is not None
        finally:
            cluster.resume_server(0)
    finally:
        conn.close()
    assert query(cluster, 0, "SELECT 1") == ((1,),)


def test_kill_and_restart_keeps_committed_rows(solo: Solo) -> None:
    cluster = solo.cluster
    cluster.up()
    conn = connect(cluster, 0)
    try:
        cur = conn.cursor()
        cur.execute("CREATE DATABASE IF NOT EXISTS t_local")
        cur.execute("CREATE TABLE IF NOT EXISTS t_local.kv (k INT PRIMARY KEY, v VARCHAR(20))")
        cur.execute("REPLACE INTO t_local.kv VALUES (1, 'survives')")
        conn.commit()
    finally:
        conn.close()
    old_pid = cluster.servers[0].pid()
    cluster.kill_server(0)
    assert cluster.servers[0].pid() is None
    assert not cluster.servers[0].running()
    assert cluster.status()[0]["running"] is False
    cluster.start_server(0)
    assert cluster.servers[0].pid() not in (None, old_pid)
    assert query(cluster, 0, "SELECT v FROM t_local.kv WHERE k = 1") == (("survives",),)


def test_graceful_stop_of_a_paused_server_and_start(solo: Solo) -> None:
    cluster = solo.cluster
    cluster.up()
    server = cluster.servers[0]
    cluster.pause_server(0)  # stop must wake it up to see its SIGTERM
    cluster.stop_server(0)
    assert server.pid() is None
    assert not server.pidfile.exists()  # removed by mariadbd itself on a clean shutdown
    assert "Shutdown complete" in server.logfile.read_text().rstrip().splitlines()[-1]
    cluster.start_server(0)
    assert server.running()


def test_up_adds_missing_servers(solo: Solo) -> None:
    solo.cluster.up()
    first = solo.cluster.servers[0]
    pid0 = first.pid()
    grown = LocalCluster(solo.cluster.base_dir, servers=2).up()
    assert len(grown.servers) == 2
    assert grown.servers[0] == first and grown.servers[0].pid() == pid0
    assert grown.servers[1].port != first.port
    # The new server has the application user, with the same password.
    ((user,),) = query(grown, 1, "SELECT CURRENT_USER()")
    assert user == "schemaless@127.0.0.1"
    assert LocalCluster(solo.cluster.base_dir, servers=1).servers == grown.servers


def test_down_then_port_conflict_is_a_clear_error(solo: Solo) -> None:
    cluster = LocalCluster(solo.cluster.base_dir)
    cluster.down()
    assert all(row["pid"] is None and row["running"] is False for row in cluster.status())
    port = cluster.servers[0].port
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(LocalClusterError, match=rf"port {port}(.|\n)*Address already in use"):
            cluster.start_server(0, timeout=20)
    t0 = time.monotonic()
    cluster.up()
    assert time.monotonic() - t0 < 20
    assert all(s.running() for s in cluster.servers)


# -- no server needed -----------------------------------------------------------------


def test_missing_mariadbd_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(local_server, "MARIADBD_DIRS", ())
    with pytest.raises(LocalClusterError, match=r"mariadbd not found.*make deps"):
        LocalCluster(tmp_path / "nothing").up()
    assert not (tmp_path / "nothing").exists()


def test_cli_and_store_start_without_the_local_cluster() -> None:
    # Development tooling: loaded by `schemaless local` and open_store's fallback only.
    code = (
        "import sys, schemaless, schemaless.cli.main, schemaless.cleaner.main\n"
        "print([m for m in sys.modules if m.split('.')[:2] == ['schemaless', 'local']])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_default_base_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEMALESS_LOCAL_DIR", str(tmp_path / "here"))
    assert default_base_dir() == tmp_path / "here"
    monkeypatch.delenv("SCHEMALESS_LOCAL_DIR")
    monkeypatch.chdir(tmp_path)
    assert default_base_dir() == tmp_path / ".schemaless-local"
    assert LocalCluster().base_dir == tmp_path / ".schemaless-local"
    assert LocalCluster().servers == []
    with pytest.raises(LocalClusterError, match="no server 0"):
        LocalCluster().kill_server(0)
