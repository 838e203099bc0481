"""A local cluster's state: its servers and replicas, the state file, the lock."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import LocalClusterError
from .server import LocalServer, free_ports, write_atomic

__all__ = ["ClusterState"]

_STATE_VERSION = 1
_MAX_SOCKET_PATH = 100  # AF_UNIX paths are limited to 107 bytes; keep a margin


class ClusterState:
    """The servers and replicas of a cluster's folder (``cluster.json``), its files,
    and an exclusive lock on it; the layers above start, stop and set them up."""

    base_dir: Path
    durable: bool
    tls: bool
    extra_config: dict[str, str]
    servers: list[LocalServer]
    replicas: list[LocalServer]
    _wanted_replicas: int
    _procs: dict[Path, subprocess.Popen[bytes]]  # by pid file
    _lock_depth: int
    _lock_fd: int | None

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

    @property
    def replica_addresses(self) -> list[str]:
        """``["127.0.0.1:PORT", ...]`` of the read replicas, in replica order."""
        return [r.address for r in self.replicas]

    @property
    def replication_file(self) -> Path:
        """``base_dir/replication.cnf``: the replication user's credentials, mode 0600."""
        return self.base_dir / "replication.cnf"

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
        write_atomic(self._state_file, json.dumps(state, indent=2) + "\n", 0o644)

    def _grow(self, wanted: int) -> None:
        """Reload the state (another process may have changed it), add missing servers."""
        self._reload()
        missing = wanted - len(self.servers)
        if missing > 0:
            taken = {s.port for s in self.servers}
            for port in free_ports(missing, taken):
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
        (port,) = free_ports(1, taken)
        index = max((r.index for r in self.replicas), default=-1) + 1
        replica = self._make_server(index, port, of)
        self.replicas.append(replica)
        return replica
