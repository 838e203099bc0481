"""A local cluster of real ``mariadbd`` processes, for development, the demo and tests.

Everything lives under one base directory::

    cluster.json          state: the servers and their ports, the durable flag
    client.cnf            [client] user and password of the application user (0600)
    server<i>/my.cnf      the server's only option file
    server<i>/data/       its data directory (made by mariadb-install-db)
    server<i>/mysqld.sock, mysqld.pid, error.log, install.log
    replica<j>/           a read replica (``replicas=N``, ``add_replica``), the same files
    replication.cnf       [client] user and password of the replication user (0600)
    tls/                  ``tls=True``: ca.pem, server-cert.pem, server-key.pem (0600)

Servers run detached (their own session), so they outlive the process that started
them; a later :class:`LocalCluster` on the same directory finds them again through
the state file, the pid file and a TCP probe.  The application user's password is
written only to ``client.cnf``; connect with::

    MySQLdb.connect(host="127.0.0.1", port=port,
                    read_default_file=str(cluster.option_file), read_default_group="client")
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import getpass
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import MySQLdb

__all__ = ["LocalCluster", "LocalClusterError", "LocalServer", "default_base_dir"]

logger = logging.getLogger(__name__)

APP_USER = "schemaless"
REPLICATION_USER = "schemaless_repl"
_HOST = "127.0.0.1"
_STATE_VERSION = 1
_MARIADBD_DIRS: Sequence[str] = ("/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin")
_INSTALL_DB_DIRS: Sequence[str] = ("/usr/bin", "/usr/local/bin", "/usr/scripts")
_MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes; keep a margin
_POLL = 0.05
_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")


class LocalClusterError(Exception):
    """The local cluster could not be set up, started or stopped."""


def default_base_dir() -> Path:
    """``$SCHEMALESS_LOCAL_DIR``, or ``./.schemaless-local``, as an absolute path."""
    env = os.environ.get("SCHEMALESS_LOCAL_DIR")
    return Path(env or ".schemaless-local").expanduser().absolute()


@dataclass(frozen=True)
class LocalServer:
    """One ``mariadbd`` of a local cluster and the files that belong to it."""

    index: int
    port: int
    datadir: Path
    socket: Path
    pidfile: Path
    logfile: Path
    replica_of: int | None = None  # a read replica: the index of its primary

    @property
    def address(self) -> str:
        """``"127.0.0.1:PORT"``."""
        return f"{_HOST}:{self.port}"

    @property
    def label(self) -> str:
        """``"server 1"``, or ``"replica 0 (of server 0)"``: for messages."""
        if self.replica_of is None:
            return f"server {self.index}"
        return f"replica {self.index} (of server {self.replica_of})"

    @property
    def server_id(self) -> int:
        """A ``server_id`` unique in the cluster: 1 + index, replicas from 1001."""
        return self.index + (1 if self.replica_of is None else 1001)

    @property
    def config_file(self) -> Path:
        """The server's ``my.cnf``."""
        return self.datadir.parent / "my.cnf"

    def pid(self) -> int | None:
        """The pid in the pid file if that process is alive and is this server."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid > 0 and _is_server_process(pid, self.config_file) else None

    def running(self) -> bool:
        """True if the process is alive and accepts a TCP connection on its port."""
        return self.pid() is not None and _tcp_accepts(self.port)


class LocalCluster:
    """Create, start, find again and stop a local cluster of ``mariadbd`` servers."""

    def __init__(
        self,
        base_dir: str | Path | None = None,
        servers: int = 2,
        *,
        durable: bool = True,
        tls: bool = False,
        extra_config: Mapping[str, str] | None = None,
        replicas: int = 0,
    ) -> None:
        """``tls``: make a CA and a server certificate (``tls_dir``, with the openssl
        CLI) and require TLS on TCP.  ``extra_config``: more ``[mysqld]`` options, also
        given to mariadb-install-db (e.g. ``innodb_data_file_path``).  Neither is kept
        in the state file: pass them again to the object that starts the servers."""
        if servers < 1:
            raise ValueError(f"servers must be at least 1, not {servers}")
        self.base_dir: Path = (
            Path(base_dir).expanduser().absolute() if base_dir is not None else default_base_dir()
        )
        self.durable = durable
        self.tls = tls
        self.extra_config = {str(k): str(v) for k, v in (extra_config or {}).items()}
        for key, value in self.extra_config.items():
            if not _OPTION.match(key) or "\n" in value or "\r" in value:
                raise ValueError(f"invalid server option {key!r} = {value!r}")
        self._wanted = servers
        # ``replicas``: read replicas of server 0 (kept in the state file; see add_replica).
        if replicas < 0:
            raise ValueError(f"replicas must not be negative, not {replicas}")
        self._wanted_replicas = replicas
        self._procs: dict[Path, subprocess.Popen[bytes]] = {}  # by pid file
        self._lock_depth = 0
        self._lock_fd: int | None = None
        self.servers: list[LocalServer] = []
        self.replicas: list[LocalServer] = []
        self._reload()

    def __repr__(self) -> str:
        return (
            f"LocalCluster({str(self.base_dir)!r}, servers={len(self.servers)}, "
            f"durable={self.durable})"
        )

    # -- public API ---------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """``["127.0.0.1:PORT", ...]`` in server order."""
        return [s.address for s in self.servers]

    @property
    def option_file(self) -> Path:
        """``base_dir/client.cnf``: the application user's credentials, mode 0600."""
        return self.base_dir / "client.cnf"

    @property
    def tls_dir(self) -> Path:
        """``base_dir/tls``: ``ca.pem`` (give it to clients as ``ssl={"ca": ...}``),
        ``server-cert.pem``, ``server-key.pem`` (for 127.0.0.1 and localhost)."""
        return self.base_dir / "tls"

    @property
    def ca_file(self) -> Path:
        """The CA certificate of a TLS cluster."""
        return self.tls_dir / "ca.pem"

    def up(self, timeout: float = 60.0) -> LocalCluster:
        """Initialise missing servers, start those not running, wait until all accept.

        Idempotent: running servers are left alone.  If the state knows fewer servers
        than were asked for, the missing ones are added (never removed).
        """
        deadline = time.monotonic() + timeout
        mariadbd = _find_binary("mariadbd", _MARIADBD_DIRS)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            self._grow(self._wanted)
            if self.tls:
                _make_certificates(self.tls_dir)
            fresh = [s for s in (*self.servers, *self.replicas) if not s.datadir.is_dir()]
            if fresh:
                self._install_datadirs(fresh, deadline)
            self._start(self.servers, mariadbd, deadline)
            self._ensure_app_user(deadline)
            self._up_replicas(mariadbd, deadline)
        return self

    def down(self, timeout: float = 60.0) -> None:
        """Stop every server gracefully (SIGTERM; SIGKILL after ``timeout``)."""
        if not self.base_dir.is_dir():
            return
        with self._locked():
            self._reload()  # another process may have added servers
            self._stop([*self.replicas, *self.servers], timeout)

    def status(self) -> list[dict[str, object]]:
        """Per server: index, port, address, pid, running, datadir."""
        out: list[dict[str, object]] = []
        for s in self.servers:
            pid = s.pid()
            out.append(
                {
                    "index": s.index,
                    "port": s.port,
                    "address": s.address,
                    "pid": pid,
                    "running": pid is not None and _tcp_accepts(s.port),
                    "datadir": str(s.datadir),
                }
            )
        return out

    def kill_server(self, i: int) -> None:
        """SIGKILL server ``i`` and wait until it is gone."""
        server = self._server(i)
        pid = server.pid()
        if pid is None:
            return
        logger.info("killing server %d (pid %d)", i, pid)
        _signal(pid, signal.SIGKILL)
        if not self._wait_gone(server, pid, 30.0):
            raise LocalClusterError(f"server {i} (pid {pid}) survived SIGKILL for 30s")
        server.pidfile.unlink(missing_ok=True)

    def stop_server(self, i: int) -> None:
        """Stop server ``i`` gracefully."""
        server = self._server(i)
        with self._locked():
            self._stop([server], 60.0)

    def start_server(self, i: int, timeout: float = 60.0) -> None:
        """Start server ``i`` (if not running) and wait until it accepts connections."""
        deadline = time.monotonic() + timeout
        server = self._server(i)
        mariadbd = _find_binary("mariadbd", _MARIADBD_DIRS)
        with self._locked():
            if self.tls:
                _make_certificates(self.tls_dir)
            if not server.datadir.is_dir():
                self._install_datadirs([server], deadline)
            self._start([server], mariadbd, deadline)
            self._ensure_app_user(deadline)

    def pause_server(self, i: int) -> None:
        """Freeze server ``i`` with SIGSTOP (connections hang, nothing fails); returns
        once every thread has stopped (a signal takes effect asynchronously)."""
        pid = self._require_pid(i)
        logger.info("pausing server %d (pid %d)", i, pid)
        _signal(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10.0
        while not _all_threads_stopped(pid) and time.monotonic() < deadline:
            time.sleep(0.001)

    def resume_server(self, i: int) -> None:
        """Resume server ``i`` with SIGCONT."""
        pid = self._require_pid(i)
        logger.info("resuming server %d (pid %d)", i, pid)
        _signal(pid, signal.SIGCONT)

    # -- state ----------------------------------------------------------------------

    @property
    def _state_file(self) -> Path:
        return self.base_dir / "cluster.json"

    def _load_ports(self) -> list[int]:
        try:
            raw = self._state_file.read_text()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise LocalClusterError(f"cannot read {self._state_file}: {e}") from e
        try:
            state = json.loads(raw)
            entries = sorted(state["servers"], key=lambda e: int(e["index"]))
            ports = [int(e["port"]) for e in entries]
            if [int(e["index"]) for e in entries] != list(range(len(ports))):
                raise ValueError("server indexes are not 0..n-1")
        except (ValueError, KeyError, TypeError) as e:
            raise LocalClusterError(f"{self._state_file} is not a valid cluster state: {e}") from e
        return ports

    def _save_state(self) -> None:
        state = {
            "version": _STATE_VERSION,
            "durable": self.durable,
            "servers": [{"index": s.index, "port": s.port} for s in self.servers],
            "replicas": [
                {"index": r.index, "port": r.port, "of": r.replica_of} for r in self.replicas
            ],
        }
        _write_atomic(self._state_file, json.dumps(state, indent=2) + "\n", 0o644)

    def _grow(self, wanted: int) -> None:
        """Reload the state (another process may have changed it), add missing servers."""
        self._reload()
        missing = wanted - len(self.servers)
        if missing > 0:
            taken = {s.port for s in self.servers}
            for port in _free_ports(missing, taken):
                self.servers.append(self._make_server(len(self.servers), port))
        for _ in range(self._wanted_replicas - len(self._replicas_of(0))):
            self._register_replica(0)  # before server 0's first start: it needs a binlog
        self._save_state()

    def _reload(self) -> None:
        self.servers = [self._make_server(i, p) for i, p in enumerate(self._load_ports())]
        self.replicas = [self._make_server(i, p, of) for i, p, of in self._load_replicas()]

    def _make_server(self, i: int, port: int, replica_of: int | None = None) -> LocalServer:
        kind = "server" if replica_of is None else "replica"
        sdir = self.base_dir / f"{kind}{i}"
        sock = sdir / "mysqld.sock"
        if len(os.fsencode(str(sock))) > _MAX_SOCKET_PATH:
            # Deep base directories (pytest's tmp_path) overflow AF_UNIX's limit.
            digest = hashlib.sha256(os.fsencode(str(self.base_dir))).hexdigest()[:16]
            sock = Path(tempfile.gettempdir()) / f"schemaless-{digest}" / f"{kind}{i}.sock"
        return LocalServer(
            index=i,
            port=port,
            datadir=sdir / "data",
            socket=sock,
            pidfile=sdir / "mysqld.pid",
            logfile=sdir / "error.log",
            replica_of=replica_of,
        )

    def _server(self, i: int) -> LocalServer:
        if not 0 <= i < len(self.servers):
            raise LocalClusterError(f"no server {i}: the cluster has {len(self.servers)}")
        return self.servers[i]

    def _require_pid(self, i: int) -> int:
        pid = self._server(i).pid()
        if pid is None:
            raise LocalClusterError(f"server {i} is not running")
        return pid

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive lock on the base directory (reentrant within this object)."""
        if self._lock_depth == 0:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.base_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._lock_fd = fd
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0 and self._lock_fd is not None:
                os.close(self._lock_fd)  # closing releases the flock
                self._lock_fd = None

    # -- initialisation -------------------------------------------------------------

    def _install_datadirs(self, servers: Sequence[LocalServer], deadline: float) -> None:
        """Run mariadb-install-db for each server, in parallel, into ``data.init``.

        The directory is renamed to ``data`` only on success, so an interrupted
        initialisation is redone instead of leaving a half-made data directory.
        """
        install_db = _find_binary("mariadb-install-db", _INSTALL_DB_DIRS)
        jobs: list[tuple[LocalServer, Path, Path, subprocess.Popen[bytes]]] = []
        try:
            for s in servers:
                sdir = s.datadir.parent
                sdir.mkdir(parents=True, exist_ok=True)
                tmp = sdir / "data.init"
                shutil.rmtree(tmp, ignore_errors=True)
                (sdir / "tmp").mkdir(exist_ok=True)
                log = sdir / "install.log"
                cmd = [
                    install_db,
                    "--no-defaults",
                    f"--datadir={tmp}",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                    "--skip-name-resolve",
                    "--innodb-log-file-size=64M",  # as in my.cnf: no resize at first start
                    f"--tmpdir={sdir / 'tmp'}",  # parallel bootstraps clash in a shared /tmp
                    *_user_args(socket_user=True),
                    *(f"--{k}={v}" for k, v in self.extra_config.items()),
                ]
                logger.info("initialising data directory of %s", s.label)
                with open(log, "wb") as out:
                    proc = subprocess.Popen(
                        cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                        cwd=sdir,
                    )  # fmt: skip
                jobs.append((s, tmp, log, proc))
            for s, tmp, log, proc in jobs:
                try:
                    rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    raise LocalClusterError(
                        f"mariadb-install-db for {s.label} timed out; "
                        f"{log}:\n{_install_log_excerpt(log)}"
                    ) from None
                if rc != 0:
                    raise LocalClusterError(
                        f"mariadb-install-db for {s.label} failed (exit {rc}); "
                        f"{log}:\n{_install_log_excerpt(log)}"
                    )
                tmp.rename(s.datadir)
        finally:
            for _, _, _, proc in jobs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _write_config(self, s: LocalServer) -> None:
        sdir = s.datadir.parent
        flush = 1 if self.durable else 2
        text = f"""\
# Written by schemaless.local; rewritten at every start.
[mysqld]
bind-address = {_HOST}
port = {s.port}
socket = {s.socket}
datadir = {s.datadir}
pid-file = {s.pidfile}
log-error = {s.logfile}
tmpdir = {sdir / "tmp"}
skip-name-resolve
character-set-server = utf8mb4
collation-server = utf8mb4_nopad_bin
innodb_flush_log_at_trx_commit = {flush}
innodb_buffer_pool_size = 128M
innodb_log_file_size = 64M
innodb_file_per_table = 1
max_connections = 400
max_allowed_packet = 64M
max_connect_errors = 1000000000
performance_schema = OFF
{self._replication_lines(s)}{self._extra_lines()}
# For a manual `mariadb --defaults-file=.../my.cnf` (root, over the socket).
[client]
port = {s.port}
socket = {s.socket}
"""
        (sdir / "tmp").mkdir(parents=True, exist_ok=True)
        _write_atomic(s.config_file, text, 0o644)

    def _extra_lines(self) -> str:
        lines = []
        if self.tls:
            lines += [
                f"ssl_ca = {self.ca_file}",
                f"ssl_cert = {self.tls_dir / 'server-cert.pem'}",
                f"ssl_key = {self.tls_dir / 'server-key.pem'}",
                "require_secure_transport = ON",
            ]
        lines += [f"{k} = {v}" for k, v in self.extra_config.items()]
        return "".join(line + "\n" for line in lines)

    # -- starting and stopping ------------------------------------------------------

    def _start(self, servers: Sequence[LocalServer], mariadbd: str, deadline: float) -> None:
        """Start the servers that are not alive, then wait until every one accepts."""
        started: dict[Path, tuple[subprocess.Popen[bytes], int, float]] = {}
        for s in servers:
            if s.pid() is not None:
                continue
            self._write_config(s)
            s.pidfile.unlink(missing_ok=True)
            s.socket.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                if s.socket.is_socket():
                    s.socket.unlink()
            offset = s.logfile.stat().st_size if s.logfile.exists() else 0
            logger.info("starting %s on %s", s.label, s.address)
            with open(s.logfile, "ab") as out:
                proc = subprocess.Popen(
                    [mariadbd, f"--defaults-file={s.config_file}", *_user_args()],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=s.datadir.parent,
                    start_new_session=True,
                )
            self._procs[s.pidfile] = proc
            started[s.pidfile] = (proc, offset, time.monotonic())
        for s in servers:
            if s.pidfile in started:
                proc, offset, t0 = started[s.pidfile]
                self._wait_started(s, proc, offset, deadline)
                logger.info("%s ready in %.1fs", s.label, time.monotonic() - t0)
            else:
                self._wait_found(s, deadline)

    def _wait_started(
        self, s: LocalServer, proc: subprocess.Popen[bytes], offset: int, deadline: float
    ) -> None:
        while True:
            rc = proc.poll()
            if rc is not None:
                raise LocalClusterError(
                    f"{s.label} (port {s.port}) exited with status {rc} while "
                    f"starting; {s.logfile}:\n{_tail(s.logfile, offset)}"
                )
            # Probe only once the log says so: every probe is an "aborted connection".
            if _log_contains(s.logfile, offset, b"ready for connections") and _mysql_answers(
                s.port, min(2.0, max(0.1, deadline - time.monotonic()))
            ):
                return
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"{s.label} (pid {proc.pid}, port {s.port}) did not accept "
                    f"connections in time (still running; `down` stops it); "
                    f"{s.logfile}:\n{_tail(s.logfile, offset)}"
                )
            time.sleep(_POLL)

    def _wait_found(self, s: LocalServer, deadline: float) -> None:
        """Wait for a server that some other call started (it may still be starting)."""
        while not _tcp_accepts(s.port):
            pid = s.pid()
            if pid is None:
                raise LocalClusterError(
                    f"{s.label} exited while starting; {s.logfile}:\n{_tail(s.logfile)}"
                )
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"{s.label} (pid {pid}) runs but does not accept connections "
                    f"on port {s.port} in time (still starting, or hung?)"
                )
            time.sleep(_POLL)

    def _stop(self, servers: Sequence[LocalServer], timeout: float) -> None:
        pids: list[tuple[LocalServer, int]] = []
        for s in servers:
            pid = s.pid()
            if pid is None:
                continue
            logger.info("stopping %s (pid %d)", s.label, pid)
            _signal(pid, signal.SIGTERM)
            _signal(pid, signal.SIGCONT)  # a paused server must wake up to see SIGTERM
            pids.append((s, pid))
        deadline = time.monotonic() + timeout
        for s, pid in pids:
            if self._wait_gone(s, pid, max(0.0, deadline - time.monotonic())):
                continue
            logger.warning("%s (pid %d) ignored SIGTERM; sending SIGKILL", s.label, pid)
            _signal(pid, signal.SIGKILL)
            if not self._wait_gone(s, pid, 30.0):
                raise LocalClusterError(f"{s.label} (pid {pid}) survived SIGKILL")
            s.pidfile.unlink(missing_ok=True)

    def _wait_gone(self, s: LocalServer, pid: int, timeout: float) -> bool:
        """Wait until ``pid`` has exited (and reap it if this object started it)."""
        proc = self._procs.get(s.pidfile)
        if proc is not None and proc.pid == pid:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            del self._procs[s.pidfile]
            return True
        deadline = time.monotonic() + timeout
        while _is_server_process(pid, s.config_file):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)
        return True

    # -- the application user -------------------------------------------------------

    def _marker(self, s: LocalServer) -> Path:
        return s.datadir.parent / ".app-user"

    def _ensure_app_user(self, deadline: float) -> None:
        """Create the application user where it is missing (first init, new servers).

        The password is made here, written to ``client.cnf`` (0600) before it goes
        anywhere else, and sent to the servers only as a statement parameter.
        """
        password = self._read_password()
        todo = [s for s in self.servers if not self._marker(s).exists()]
        if password is None:
            password = secrets.token_urlsafe(24)
            text = f"# schemaless local cluster: keep private\n[client]\nuser={APP_USER}\n"
            _write_atomic(self.option_file, text + f"password={password}\n", 0o600)
            todo = list(self.servers)
        for s in todo:
            self._create_user(s, password, deadline)
            self._marker(s).touch()

    def _read_password(self) -> str | None:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read_string(self.option_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, configparser.Error) as e:
            raise LocalClusterError(f"cannot read {self.option_file}: {type(e).__name__}") from None
        pw = parser.get("client", "password", fallback=None)
        return pw or None

    def _create_user(self, s: LocalServer, password: str, deadline: float) -> None:
        root = "root" if os.geteuid() == 0 else getpass.getuser()
        statements = [
            f"CREATE OR REPLACE USER '{APP_USER}'@'{_HOST}' IDENTIFIED BY %s",
            f"CREATE OR REPLACE USER '{APP_USER}'@'localhost' IDENTIFIED BY %s",
            f"GRANT ALL PRIVILEGES ON *.* TO '{APP_USER}'@'{_HOST}' WITH GRANT OPTION",
            f"GRANT ALL PRIVILEGES ON *.* TO '{APP_USER}'@'localhost' WITH GRANT OPTION",
        ]
        while True:
            try:
                conn = MySQLdb.connect(unix_socket=str(s.socket), user=root, connect_timeout=5)
                break
            except MySQLdb.OperationalError as e:
                if time.monotonic() >= deadline or s.pid() is None:
                    raise LocalClusterError(
                        f"cannot connect to server {s.index} as {root!r} over {s.socket} "
                        f"to create the application user: {e}"
                    ) from None
                time.sleep(0.2)
        try:
            cur = conn.cursor()
            for sql in statements:
                cur.execute(sql, (password,) if "%s" in sql else None)
        except MySQLdb.Error as e:
            # Never chain: the driver's exception may quote the statement.
            code = e.args[0] if e.args else "?"
            msg = str(e.args[1]) if len(e.args) > 1 else ""
            raise LocalClusterError(
                f"creating the application user on server {s.index} failed: "
                f"({code}) {msg.replace(password, '***')}"
            ) from None
        finally:
            conn.close()
        logger.info("application user %r ready on server %d", APP_USER, s.index)

    # -- read replicas ----------------------------------------------------------------
    #
    # A replica is a mariadbd of its own (``replica<j>/``, ``server_id`` 1001 + j,
    # ``read_only``) replicating one primary with GTIDs.  The application user may only
    # SELECT there (and read SHOW REPLICA STATUS), so a misrouted write fails loudly.
    # A primary with a replica writes a ROW binlog; a cluster that asks for replicas at
    # creation (``replicas=N``) has it from its first start.  Replication begins at the
    # primary's current GTID position and nothing is copied, so a primary must not hold
    # any database when its replica is set up (seed one with mariadb-backup otherwise).

    @property
    def replica_addresses(self) -> list[str]:
        """``["127.0.0.1:PORT", ...]`` of the read replicas, in replica order."""
        return [r.address for r in self.replicas]

    @property
    def replication_file(self) -> Path:
        """``base_dir/replication.cnf``: the replication user's credentials, mode 0600."""
        return self.base_dir / "replication.cnf"

    def add_replica(self, of: int = 0, timeout: float = 60.0) -> LocalServer:
        """Add a read replica of server ``of``, start it, wait until it replicates.

        Server ``of`` must be running and hold no database yet; if it runs without a
        binary log it is restarted with one.
        """
        deadline = time.monotonic() + timeout
        mariadbd = _find_binary("mariadbd", _MARIADBD_DIRS)
        with self._locked():
            self._reload()
            primary = self._server(of)
            if not primary.running():
                raise LocalClusterError(f"{primary.label} is not running: run up() first")
            self._check_empty(primary, deadline)
            replica = self._register_replica(of)
            self._save_state()
            self._up_replicas(mariadbd, deadline)
        return replica

    def stop_replica(self, j: int) -> None:
        """Stop replica ``j`` (its process) gracefully."""
        with self._locked():
            self._stop([self._replica(j)], 60.0)

    def start_replica(self, j: int, timeout: float = 60.0) -> None:
        """Start replica ``j`` (if not running); replication resumes where it stopped."""
        deadline = time.monotonic() + timeout
        mariadbd = _find_binary("mariadbd", _MARIADBD_DIRS)
        with self._locked():
            self._start([self._replica(j)], mariadbd, deadline)

    def stop_replication(self, j: int) -> None:
        """``STOP SLAVE`` on replica ``j``: it keeps serving reads, more and more stale."""
        self._as_root(self._replica(j), [("STOP SLAVE", None)], time.monotonic() + 30)

    def start_replication(self, j: int, delay: int = 0) -> None:
        """(Re)start replication on replica ``j``, applying each event ``delay`` seconds
        after it was written on the primary (``MASTER_DELAY``: a lag on purpose)."""
        if delay < 0:
            raise ValueError(f"delay must not be negative, not {delay}")
        self._as_root(
            self._replica(j),
            [
                ("STOP SLAVE", None),
                ("CHANGE MASTER TO MASTER_DELAY = %s", (int(delay),)),
                ("START SLAVE", None),
            ],
            time.monotonic() + 30,
        )

    def replication_status(self, j: int) -> dict[str, Any]:
        """Replica ``j``'s ``SHOW REPLICA STATUS`` row (empty if not configured)."""
        rows = self._as_root(self._replica(j), [("SHOW SLAVE STATUS", None)], time.monotonic() + 30)
        return rows[0][0] if rows[0] else {}

    def wait_replicated(self, j: int, timeout: float = 30.0) -> None:
        """Wait until replica ``j`` has applied everything its primary has written."""
        deadline = time.monotonic() + timeout
        replica = self._replica(j)
        primary = self._server(self._primary_index(replica))
        pos = self._as_root(primary, [("SELECT @@gtid_binlog_pos AS pos", None)], deadline)
        wait = max(0.1, deadline - time.monotonic())
        got = self._as_root(
            replica,
            [("SELECT MASTER_GTID_WAIT(%s, %s) AS done", (pos[0][0]["pos"], wait))],
            deadline,
        )
        if got[0][0]["done"] != 0:
            raise LocalClusterError(
                f"{replica.label} did not catch up with {primary.label} in {timeout:.0f}s: "
                f"{self._replication_errors(replica)}"
            )

    def _replica(self, j: int) -> LocalServer:
        for r in self.replicas:
            if r.index == j:
                return r
        raise LocalClusterError(f"no replica {j}: the cluster has {len(self.replicas)}")

    @staticmethod
    def _primary_index(replica: LocalServer) -> int:
        if replica.replica_of is None:
            raise LocalClusterError(f"{replica.label} is not a replica")
        return replica.replica_of

    def _replicas_of(self, of: int) -> list[LocalServer]:
        return [r for r in self.replicas if r.replica_of == of]

    def _load_replicas(self) -> list[tuple[int, int, int]]:
        """``(index, port, primary index)`` of the replicas in the state file."""
        try:
            raw = self._state_file.read_text()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise LocalClusterError(f"cannot read {self._state_file}: {e}") from e
        try:
            entries = json.loads(raw).get("replicas") or []
            return sorted((int(e["index"]), int(e["port"]), int(e["of"])) for e in entries)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise LocalClusterError(f"{self._state_file} is not a valid cluster state: {e}") from e

    def _register_replica(self, of: int) -> LocalServer:
        """Add a replica of server ``of`` to ``self.replicas`` (the caller saves)."""
        taken = {s.port for s in (*self.servers, *self.replicas)}
        (port,) = _free_ports(1, taken)
        index = max((r.index for r in self.replicas), default=-1) + 1
        replica = self._make_server(index, port, of)
        self.replicas.append(replica)
        return replica

    def _forget_replica(self, replica: LocalServer) -> None:
        """Undo a replica that could not be set up: stop it, remove its files."""
        self._stop([replica], 60.0)
        shutil.rmtree(replica.datadir.parent, ignore_errors=True)
        self.replicas = [r for r in self.replicas if r.pidfile != replica.pidfile]
        self._save_state()

    def _replication_lines(self, s: LocalServer) -> str:
        """``my.cnf`` lines: a unique server_id; a ROW binlog on a primary that has a
        replica (else none); read_only and a relay log on a replica."""
        lines = [f"server-id = {s.server_id}"]
        if s.replica_of is not None:
            lines += ["skip-log-bin", "read_only = 1", "relay-log = relay-bin"]
        elif self._replicas_of(s.index):
            lines += [
                "log-bin = binlog",
                "binlog-format = ROW",
                f"sync_binlog = {1 if self.durable else 0}",
                "binlog_expire_logs_seconds = 86400",
            ]
        else:
            lines.append("skip-log-bin")
        return "".join(line + "\n" for line in lines)

    def _done_marker(self, replica: LocalServer) -> Path:
        return replica.datadir.parent / ".replicating"

    def _up_replicas(self, mariadbd: str, deadline: float) -> None:
        """Start every replica; make its user and set up replication where not done."""
        if not self.replicas:
            return
        for replica in list(self.replicas):
            if not self._done_marker(replica).exists():
                primary = self._server(self._primary_index(replica))
                try:
                    self._check_empty(primary, deadline)
                except LocalClusterError:
                    self._forget_replica(replica)
                    raise
        fresh = [r for r in self.replicas if not r.datadir.is_dir()]
        if fresh:
            self._install_datadirs(fresh, deadline)
        self._start(self.replicas, mariadbd, deadline)
        password = self._read_password()
        if password is None:
            raise LocalClusterError(f"{self.option_file} is missing: run up() again")
        for replica in self.replicas:
            if not self._marker(replica).exists():
                self._create_reader(replica, password, deadline)
                self._marker(replica).touch()
            if not self._done_marker(replica).exists():
                self._setup_replication(replica, mariadbd, deadline)
                self._done_marker(replica).touch()

    def _check_empty(self, primary: LocalServer, deadline: float) -> None:
        """Refuse to start replicating a primary that already holds databases."""
        rows = self._as_root(
            primary,
            [
                (
                    "SELECT schema_name AS name FROM information_schema.schemata WHERE"
                    " schema_name NOT IN ('mysql', 'information_schema',"
                    " 'performance_schema', 'sys')",
                    None,
                )
            ],
            deadline,
        )[0]
        if rows:
            names = ", ".join(sorted(str(r["name"]) for r in rows)[:5])
            raise LocalClusterError(
                f"{primary.label} already holds databases ({names}): a replica set up now "
                "would miss them. Ask for replicas when the cluster is created "
                "(LocalCluster(replicas=N)), before any datastore is initialised."
            )

    def _create_reader(self, replica: LocalServer, password: str, deadline: float) -> None:
        """The application user on a replica: same password, SELECT only."""
        statements: list[tuple[str, tuple[Any, ...] | None]] = []
        for host in (_HOST, "localhost"):
            statements += [
                (f"CREATE OR REPLACE USER '{APP_USER}'@'{host}' IDENTIFIED BY %s", (password,)),
                (f"GRANT SELECT, SLAVE MONITOR ON *.* TO '{APP_USER}'@'{host}'", None),
            ]
        self._as_root(replica, statements, deadline, secret=password)
        logger.info("read-only application user %r ready on %s", APP_USER, replica.label)

    def _replication_credentials(self) -> tuple[str, str]:
        """The replication user and its password (made once, kept 0600)."""
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read_string(self.replication_file.read_text())
        except FileNotFoundError:
            pass
        except (OSError, configparser.Error) as e:
            raise LocalClusterError(
                f"cannot read {self.replication_file}: {type(e).__name__}"
            ) from None
        password = parser.get("client", "password", fallback=None)
        if not password:
            password = secrets.token_urlsafe(24)
            text = "# schemaless local cluster: replication user, keep private\n"
            text += f"[client]\nuser={REPLICATION_USER}\npassword={password}\n"
            _write_atomic(self.replication_file, text, 0o600)
        return REPLICATION_USER, password

    def _setup_replication(self, replica: LocalServer, mariadbd: str, deadline: float) -> None:
        """Point a fresh replica at its primary's current GTID position and start it."""
        primary = self._server(self._primary_index(replica))
        user, password = self._replication_credentials()
        if not self._as_root(primary, [("SELECT @@log_bin AS on_", None)], deadline)[0][0]["on_"]:
            logger.info("restarting %s with a binary log for its replica", primary.label)
            self._stop([primary], 60.0)
            self._start([primary], mariadbd, deadline)
        pos = self._as_root(
            primary,
            [
                ("SET SESSION sql_log_bin = 0", None),  # the user is the primary's own
                (f"CREATE OR REPLACE USER '{user}'@'{_HOST}' IDENTIFIED BY %s", (password,)),
                (f"GRANT REPLICATION SLAVE ON *.* TO '{user}'@'{_HOST}'", None),
                ("SELECT @@gtid_binlog_pos AS pos", None),
            ],
            deadline,
            secret=password,
        )[-1][0]["pos"]
        change = (
            "CHANGE MASTER TO MASTER_HOST = %s, MASTER_PORT = %s, MASTER_USER = %s,"
            " MASTER_PASSWORD = %s, MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1"
        )
        params: tuple[Any, ...] = (_HOST, primary.port, user, password)
        if self.tls:
            change += ", MASTER_SSL = 1, MASTER_SSL_CA = %s, MASTER_SSL_VERIFY_SERVER_CERT = 1"
            params += (str(self.ca_file),)
        self._as_root(
            replica,
            [
                ("STOP SLAVE", None),
                ("RESET SLAVE ALL", None),
                ("SET GLOBAL gtid_slave_pos = %s", (pos,)),
                (change, params),
                ("START SLAVE", None),
            ],
            deadline,
            secret=password,
        )
        while True:
            status = self._as_root(replica, [("SHOW SLAVE STATUS", None)], deadline)[0]
            row = status[0] if status else {}
            if row.get("Slave_IO_Running") == "Yes" and row.get("Slave_SQL_Running") == "Yes":
                break
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"{replica.label} does not replicate {primary.label}: "
                    f"{self._replication_errors(replica)}"
                )
            time.sleep(0.1)
        logger.info("%s replicates %s from GTID %r", replica.label, primary.label, pos)

    def _replication_errors(self, replica: LocalServer) -> str:
        rows = self._as_root(replica, [("SHOW SLAVE STATUS", None)], time.monotonic() + 10)[0]
        if not rows:
            return "replication is not configured"
        row = rows[0]
        return (
            f"IO thread {row.get('Slave_IO_Running')} ({row.get('Last_IO_Error') or 'no error'}),"
            f" SQL thread {row.get('Slave_SQL_Running')} "
            f"({row.get('Last_SQL_Error') or 'no error'})"
        )

    def _as_root(
        self,
        s: LocalServer,
        statements: Sequence[tuple[str, tuple[Any, ...] | None]],
        deadline: float,
        *,
        secret: str | None = None,
    ) -> list[list[dict[str, Any]]]:
        """Run statements as the root user over ``s``'s socket; rows per statement as
        dicts.  Errors never quote a statement, and ``secret`` never appears in them."""
        root = "root" if os.geteuid() == 0 else getpass.getuser()
        while True:
            try:
                conn = MySQLdb.connect(unix_socket=str(s.socket), user=root, connect_timeout=5)
                break
            except MySQLdb.OperationalError as e:
                if time.monotonic() >= deadline or s.pid() is None:
                    raise LocalClusterError(
                        f"cannot connect to {s.label} as {root!r} over {s.socket}: {e}"
                    ) from None
                time.sleep(0.2)
        out: list[list[dict[str, Any]]] = []
        try:
            cur = conn.cursor()
            for sql, params in statements:
                cur.execute(sql, params)
                names = [d[0] for d in cur.description] if cur.description else []
                out.append([dict(zip(names, row, strict=True)) for row in cur.fetchall()])
        except MySQLdb.Error as e:
            code = e.args[0] if e.args else "?"
            msg = str(e.args[1]) if len(e.args) > 1 else ""
            if secret:
                msg = msg.replace(secret, "***")
            raise LocalClusterError(f"on {s.label}: ({code}) {msg}") from None
        finally:
            conn.close()
        return out


# -- helpers --------------------------------------------------------------------------


def _find_binary(name: str, dirs: Sequence[str]) -> str:
    found = shutil.which(name)
    if found:
        return found
    for d in dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise LocalClusterError(
        f"{name} not found (PATH, {', '.join(dirs)}): "
        "run `make deps` or apt-get install mariadb-server"
    )


def _user_args(*, socket_user: bool = False) -> list[str]:
    """``--user=root`` when root (mariadbd refuses root otherwise)."""
    if os.geteuid() == 0:
        return ["--user=root"]
    return [f"--auth-root-socket-user={getpass.getuser()}"] if socket_user else []


def _make_certificates(tls_dir: Path) -> None:
    """A CA and a server certificate for 127.0.0.1/localhost (openssl CLI), once."""
    if (tls_dir / "server-cert.pem").exists():
        return
    openssl = shutil.which("openssl")
    if openssl is None:
        raise LocalClusterError("openssl not found: needed for a TLS local cluster")
    tls_dir.mkdir(parents=True, exist_ok=True)
    ext = tls_dir / "server.ext"
    ext.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj",
         "/CN=schemaless local CA", "-keyout", "ca-key.pem", "-out", "ca.pem"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
         "-keyout", "server-key.pem", "-out", "server.csr"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
         "-CAcreateserial", "-days", "3650", "-extfile", "server.ext",
         "-out", "server-cert.tmp"],
    ]  # fmt: skip
    for args in steps:
        done = subprocess.run(
            [openssl, *args], cwd=tls_dir, stdin=subprocess.DEVNULL, capture_output=True
        )
        if done.returncode != 0:
            raise LocalClusterError(
                f"openssl {args[0]} failed in {tls_dir}: {done.stderr.decode(errors='replace')}"
            )
    for name in ("ca-key.pem", "server-key.pem"):
        os.chmod(tls_dir / name, 0o600)
    os.replace(tls_dir / "server-cert.tmp", tls_dir / "server-cert.pem")


def _free_ports(n: int, avoid: set[int]) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((_HOST, 0))
            port = int(sock.getsockname()[1])
            if port not in avoid:
                ports.append(port)
    finally:
        for sock in socks:
            sock.close()
    return ports


def _is_server_process(pid: int, config_file: Path) -> bool:
    """True if ``pid`` is alive, not a zombie, and runs with ``config_file``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    proc = Path("/proc") / str(pid)
    if not proc.is_dir():
        return True  # no procfs: trust the signal probe
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat[stat.rfind(")") + 2 :].startswith(("Z", "X")):
        return False
    return os.fsencode(f"--defaults-file={config_file}") in cmdline


def _all_threads_stopped(pid: int) -> bool:
    """True if every thread of ``pid`` is stopped (or procfs cannot tell)."""
    try:
        tasks = list((Path("/proc") / str(pid) / "task").iterdir())
    except OSError:
        return True
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread exited
        if not stat[stat.rfind(")") + 2 :].startswith(("T", "t", "Z", "X")):
            return False
    return True


def _tcp_accepts(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _mysql_answers(port: int, timeout: float) -> bool:
    """True if the server on ``port`` speaks the protocol: a handshake or an error packet.

    Before the application user exists, the server answers 127.0.0.1 with an error
    packet ("Host ... is not allowed to connect"): it is up all the same.
    """
    try:
        with socket.create_connection((_HOST, port), timeout=timeout) as sock:
            head = b""
            while len(head) < 5:
                chunk = sock.recv(5 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    return head[4] in (0x0A, 0xFF)


def _log_contains(path: Path, offset: int, needle: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return needle in f.read()
    except OSError:
        return False


def _install_log_excerpt(log: Path) -> str:
    """The install log without mariadb-install-db's generic advice after an error."""
    try:
        text = log.read_text(errors="replace")
    except OSError as e:
        return f"(cannot read: {e})"
    cut = text.find("The problem could be conflicting information")
    lines = (text[:cut] if cut > 0 else text).rstrip().splitlines()[-40:]
    return "\n".join(lines) if lines else "(empty)"


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _tail(path: Path, offset: int = 0, lines: int = 25) -> str:
    """The ``[ERROR]`` lines of ``path`` after ``offset``, or else its last lines."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError as e:
        return f"(cannot read: {e})"
    text = data.decode("utf-8", "replace").rstrip("\n").splitlines()
    errors = [line for line in text if "[ERROR]" in line]
    shown = errors[-lines:] if errors else text[-lines:]
    return "\n".join(shown) if shown else "(empty)"


def _write_atomic(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` through a temporary file created with ``mode``."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.fchmod(fd, mode)  # the umask must not widen or narrow it
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
