"""The local cluster: create, start, find again and stop a set of ``mariadbd``s."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from ..errors import LocalClusterError
from .replicas import Replicas
from .server import (
    LocalServer,
    all_threads_stopped,
    default_base_dir,
    find_mariadbd,
    send_signal,
    tcp_accepts,
)
from .tls import make_certificates

__all__ = ["LocalCluster"]

logger = logging.getLogger(__name__)

_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")


class LocalCluster(Replicas):
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
    def up(self, timeout: float = 60.0) -> LocalCluster:
        """Initialise missing servers, start those not running, wait until all accept.

        Idempotent: running servers are left alone.  If the state knows fewer servers
        than were asked for, the missing ones are added (never removed).
        """
        deadline = time.monotonic() + timeout
        mariadbd = find_mariadbd()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            self._grow(self._wanted)
            if self.tls:
                make_certificates(self.tls_dir)
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
        """Per server: index, port, address, pid, running, paused (frozen with SIGSTOP:
        not running), datadir."""
        out: list[dict[str, object]] = []
        for s in self.servers:
            pid, paused = s.pid(), s.paused()
            out.append(
                {
                    "index": s.index,
                    "port": s.port,
                    "address": s.address,
                    "pid": pid,
                    "running": pid is not None and not paused and tcp_accepts(s.port),
                    "paused": paused,
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
        send_signal(pid, signal.SIGKILL)
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
        mariadbd = find_mariadbd()
        with self._locked():
            if self.tls:
                make_certificates(self.tls_dir)
            if not server.datadir.is_dir():
                self._install_datadirs([server], deadline)
            self._start([server], mariadbd, deadline)
            self._ensure_app_user(deadline)

    def pause_server(self, i: int) -> None:
        """Freeze server ``i`` with SIGSTOP (connections hang, nothing fails); returns
        once every thread has stopped (a signal takes effect asynchronously)."""
        pid = self._require_pid(i)
        logger.info("pausing server %d (pid %d)", i, pid)
        send_signal(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10.0
        while not all_threads_stopped(pid) and time.monotonic() < deadline:
            time.sleep(0.001)

    def resume_server(self, i: int) -> None:
        """Resume server ``i`` with SIGCONT."""
        pid = self._require_pid(i)
        logger.info("resuming server %d (pid %d)", i, pid)
        send_signal(pid, signal.SIGCONT)
