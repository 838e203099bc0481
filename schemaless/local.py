"""A local cluster of real ``mariadbd`` processes, for development, the demo and tests.

Everything lives under one base directory::

    cluster.json          state: the servers and their ports, the durable flag
    client.cnf            [client] user and password of the application user (0600)
    server<i>/my.cnf      the server's only option file
    server<i>/data/       its data directory (made by mariadb-install-db)
    server<i>/mysqld.sock, mysqld.pid, error.log, install.log

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
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import MySQLdb

__all__ = ["LocalCluster", "LocalClusterError", "LocalServer", "default_base_dir"]

logger = logging.getLogger(__name__)

APP_USER = "schemaless"
_HOST = "127.0.0.1"
_STATE_VERSION = 1
_MARIADBD_DIRS: Sequence[str] = ("/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin")
_INSTALL_DB_DIRS: Sequence[str] = ("/usr/bin", "/usr/local/bin", "/usr/scripts")
_MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes; keep a margin
_POLL = 0.05


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

    @property
    def address(self) -> str:
        """``"127.0.0.1:PORT"``."""
        return f"{_HOST}:{self.port}"

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
        self._wanted = servers
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._lock_depth = 0
        self._lock_fd: int | None = None
        self.servers: list[LocalServer] = []
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
            fresh = [s for s in self.servers if not s.datadir.is_dir()]
            if fresh:
                self._install_datadirs(fresh, deadline)
            self._start(self.servers, mariadbd, deadline)
            self._ensure_app_user(deadline)
        return self

    def down(self, timeout: float = 60.0) -> None:
        """Stop every server gracefully (SIGTERM; SIGKILL after ``timeout``)."""
        if not self.base_dir.is_dir():
            return
        with self._locked():
            self._reload()  # another process may have added servers
            self._stop(self.servers, timeout)

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
            if not server.datadir.is_dir():
                self._install_datadirs([server], deadline)
            self._start([server], mariadbd, deadline)
            self._ensure_app_user(deadline)

    def pause_server(self, i: int) -> None:
        """Freeze server ``i`` with SIGSTOP (connections hang, nothing fails)."""
        pid = self._require_pid(i)
        logger.info("pausing server %d (pid %d)", i, pid)
        _signal(pid, signal.SIGSTOP)

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
        self._save_state()

    def _reload(self) -> None:
        self.servers = [self._make_server(i, p) for i, p in enumerate(self._load_ports())]

    def _make_server(self, i: int, port: int) -> LocalServer:
        sdir = self.base_dir / f"server{i}"
        sock = sdir / "mysqld.sock"
        if len(os.fsencode(str(sock))) > _MAX_SOCKET_PATH:
            # Deep base directories (pytest's tmp_path) overflow AF_UNIX's limit.
            digest = hashlib.sha256(os.fsencode(str(self.base_dir))).hexdigest()[:16]
            sock = Path(tempfile.gettempdir()) / f"schemaless-{digest}" / f"server{i}.sock"
        return LocalServer(
            index=i,
            port=port,
            datadir=sdir / "data",
            socket=sock,
            pidfile=sdir / "mysqld.pid",
            logfile=sdir / "error.log",
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
                ]
                logger.info("initialising data directory of server %d", s.index)
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
                        f"mariadb-install-db for server {s.index} timed out; "
                        f"{log}:\n{_install_log_excerpt(log)}"
                    ) from None
                if rc != 0:
                    raise LocalClusterError(
                        f"mariadb-install-db for server {s.index} failed (exit {rc}); "
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
skip-log-bin

# For a manual `mariadb --defaults-file=.../my.cnf` (root, over the socket).
[client]
port = {s.port}
socket = {s.socket}
"""
        (sdir / "tmp").mkdir(parents=True, exist_ok=True)
        _write_atomic(s.config_file, text, 0o644)

    # -- starting and stopping ------------------------------------------------------

    def _start(self, servers: Sequence[LocalServer], mariadbd: str, deadline: float) -> None:
        """Start the servers that are not alive, then wait until every one accepts."""
        started: dict[int, tuple[subprocess.Popen[bytes], int, float]] = {}
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
            logger.info("starting server %d on %s", s.index, s.address)
            with open(s.logfile, "ab") as out:
                proc = subprocess.Popen(
                    [mariadbd, f"--defaults-file={s.config_file}", *_user_args()],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=s.datadir.parent,
                    start_new_session=True,
                )
            self._procs[s.index] = proc
            started[s.index] = (proc, offset, time.monotonic())
        for s in servers:
            if s.index in started:
                proc, offset, t0 = started[s.index]
                self._wait_started(s, proc, offset, deadline)
                logger.info("server %d ready in %.1fs", s.index, time.monotonic() - t0)
            else:
                self._wait_found(s, deadline)

    def _wait_started(
        self, s: LocalServer, proc: subprocess.Popen[bytes], offset: int, deadline: float
    ) -> None:
        while True:
            rc = proc.poll()
            if rc is not None:
                raise LocalClusterError(
                    f"server {s.index} (port {s.port}) exited with status {rc} while "
                    f"starting; {s.logfile}:\n{_tail(s.logfile, offset)}"
                )
            # Probe only once the log says so: every probe is an "aborted connection".
            if _log_contains(s.logfile, offset, b"ready for connections") and _mysql_answers(
                s.port, min(2.0, max(0.1, deadline - time.monotonic()))
            ):
                return
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"server {s.index} (pid {proc.pid}, port {s.port}) did not accept "
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
                    f"server {s.index} exited while starting; {s.logfile}:\n{_tail(s.logfile)}"
                )
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"server {s.index} (pid {pid}) runs but does not accept connections "
                    f"on port {s.port} in time (still starting, or hung?)"
                )
            time.sleep(_POLL)

    def _stop(self, servers: Sequence[LocalServer], timeout: float) -> None:
        pids: list[tuple[LocalServer, int]] = []
        for s in servers:
            pid = s.pid()
            if pid is None:
                continue
            logger.info("stopping server %d (pid %d)", s.index, pid)
            _signal(pid, signal.SIGTERM)
            _signal(pid, signal.SIGCONT)  # a paused server must wake up to see SIGTERM
            pids.append((s, pid))
        deadline = time.monotonic() + timeout
        for s, pid in pids:
            if self._wait_gone(s, pid, max(0.0, deadline - time.monotonic())):
                continue
            logger.warning("server %d (pid %d) ignored SIGTERM; sending SIGKILL", s.index, pid)
            _signal(pid, signal.SIGKILL)
            if not self._wait_gone(s, pid, 30.0):
                raise LocalClusterError(f"server {s.index} (pid {pid}) survived SIGKILL")
            s.pidfile.unlink(missing_ok=True)

    def _wait_gone(self, s: LocalServer, pid: int, timeout: float) -> bool:
        """Wait until ``pid`` has exited (and reap it if this object started it)."""
        proc = self._procs.get(s.index)
        if proc is not None and proc.pid == pid:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            del self._procs[s.index]
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
