"""Initialising, configuring, starting and stopping a local cluster's ``mariadbd``s."""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import LocalClusterError
from .server import (
    POLL,
    LocalServer,
    bind_addresses,
    find_binary,
    install_log_excerpt,
    is_server_process,
    log_contains,
    mysql_answers,
    send_signal,
    tail,
    tcp_accepts,
    user_args,
    write_atomic,
)
from .state import ClusterState

__all__ = ["Processes"]

logger = logging.getLogger(__name__)

_INSTALL_DB_DIRS: Sequence[str] = ("/usr/bin", "/usr/local/bin", "/usr/scripts")


class Processes(ClusterState):
    """The servers' processes: data directories, ``my.cnf``, start, wait, stop."""

    def _install_datadirs(self, servers: Sequence[LocalServer], deadline: float) -> None:
        """Run mariadb-install-db for each server, in parallel, into ``data.init``.

        The directory is renamed to ``data`` only on success, so an interrupted
        initialisation is redone instead of leaving a half-made data directory.
        """
        install_db = find_binary("mariadb-install-db", _INSTALL_DB_DIRS)
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
                    *user_args(socket_user=True),
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
                        f"{log}:\n{install_log_excerpt(log)}"
                    ) from None
                if rc != 0:
                    raise LocalClusterError(
                        f"mariadb-install-db for {s.label} failed (exit {rc}); "
                        f"{log}:\n{install_log_excerpt(log)}"
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
bind-address = {bind_addresses()}
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
        write_atomic(s.config_file, text, 0o644)

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
                    [mariadbd, f"--defaults-file={s.config_file}", *user_args()],
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
                    f"starting; {s.logfile}:\n{tail(s.logfile, offset)}"
                )
            # Probe only once the log says so: every probe is an "aborted connection".
            if log_contains(s.logfile, offset, b"ready for connections") and mysql_answers(
                s.port, min(2.0, max(0.1, deadline - time.monotonic()))
            ):
                return
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"{s.label} (pid {proc.pid}, port {s.port}) did not accept "
                    f"connections in time (still running; `down` stops it); "
                    f"{s.logfile}:\n{tail(s.logfile, offset)}"
                )
            time.sleep(POLL)

    def _wait_found(self, s: LocalServer, deadline: float) -> None:
        """Wait for a server that some other call started (it may still be starting)."""
        while not tcp_accepts(s.port):
            pid = s.pid()
            if pid is None:
                raise LocalClusterError(
                    f"{s.label} exited while starting; {s.logfile}:\n{tail(s.logfile)}"
                )
            if time.monotonic() >= deadline:
                raise LocalClusterError(
                    f"{s.label} (pid {pid}) runs but does not accept connections "
                    f"on port {s.port} in time (still starting, or hung?)"
                )
            time.sleep(POLL)

    def _stop(self, servers: Sequence[LocalServer], timeout: float) -> None:
        pids: list[tuple[LocalServer, int]] = []
        for s in servers:
            pid = s.pid()
            if pid is None:
                continue
            logger.info("stopping %s (pid %d)", s.label, pid)
            send_signal(pid, signal.SIGTERM)
            send_signal(pid, signal.SIGCONT)  # a paused server must wake up to see SIGTERM
            pids.append((s, pid))
        deadline = time.monotonic() + timeout
        for s, pid in pids:
            if self._wait_gone(s, pid, max(0.0, deadline - time.monotonic())):
                continue
            logger.warning("%s (pid %d) ignored SIGTERM; sending SIGKILL", s.label, pid)
            send_signal(pid, signal.SIGKILL)
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
        while is_server_process(pid, s.config_file):
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL)
        return True
