"""One server of a local cluster, its files, and probes of its process."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import LocalClusterError

__all__ = [
    "HOST",
    "HOST6",
    "MARIADBD_DIRS",
    "POLL",
    "LocalServer",
    "all_threads_stopped",
    "bind_addresses",
    "default_base_dir",
    "find_binary",
    "find_mariadbd",
    "free_ports",
    "install_log_excerpt",
    "is_server_process",
    "log_contains",
    "mysql_answers",
    "send_signal",
    "tail",
    "tcp_accepts",
    "user_args",
    "write_atomic",
]

HOST = "127.0.0.1"
HOST6 = "::1"  # the servers listen here too where the machine has IPv6 loopback
MARIADBD_DIRS: Sequence[str] = ("/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin")
POLL = 0.05


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
        return f"{HOST}:{self.port}"

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
        return pid if pid > 0 and is_server_process(pid, self.config_file) else None

    def running(self) -> bool:
        """True if the process is alive and accepts a TCP connection on its port."""
        return self.pid() is not None and tcp_accepts(self.port)

    def paused(self) -> bool:
        """True if the process is alive and frozen (SIGSTOP): its port still accepts
        connections, but nothing answers them."""
        pid = self.pid()
        return pid is not None and (Path("/proc") / str(pid)).is_dir() and all_threads_stopped(pid)


def find_mariadbd() -> str:
    """The ``mariadbd`` binary (PATH, then the usual sbin folders)."""
    return find_binary("mariadbd", MARIADBD_DIRS)


def find_binary(name: str, dirs: Sequence[str]) -> str:
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


def user_args(*, socket_user: bool = False) -> list[str]:
    """``--user=root`` when root (mariadbd refuses root otherwise)."""
    if os.geteuid() == 0:
        return ["--user=root"]
    return [f"--auth-root-socket-user={getpass.getuser()}"] if socket_user else []


def bind_addresses() -> str:
    """The servers' ``bind-address``: ``127.0.0.1,::1``, or ``127.0.0.1`` alone on a
    machine without IPv6 loopback (mariadbd would not start)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind((HOST6, 0))
    except OSError:
        return HOST
    return f"{HOST},{HOST6}"


def free_ports(n: int, avoid: set[int]) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
            if port not in avoid:
                ports.append(port)
    finally:
        for sock in socks:
            sock.close()
    return ports


def is_server_process(pid: int, config_file: Path) -> bool:
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


def all_threads_stopped(pid: int) -> bool:
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


def tcp_accepts(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def mysql_answers(port: int, timeout: float) -> bool:
    """True if the server on ``port`` speaks the protocol: a handshake or an error packet.

    Before the application user exists, the server answers 127.0.0.1 with an error
    packet ("Host ... is not allowed to connect"): it is up all the same.
    """
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            head = b""
            while len(head) < 5:
                chunk = sock.recv(5 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    return head[4] in (0x0A, 0xFF)


def log_contains(path: Path, offset: int, needle: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return needle in f.read()
    except OSError:
        return False


def install_log_excerpt(log: Path) -> str:
    """The install log without mariadb-install-db's generic advice after an error."""
    try:
        text = log.read_text(errors="replace")
    except OSError as e:
        return f"(cannot read: {e})"
    cut = text.find("The problem could be conflicting information")
    lines = (text[:cut] if cut > 0 else text).rstrip().splitlines()[-40:]
    return "\n".join(lines) if lines else "(empty)"


def send_signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def tail(path: Path, offset: int = 0, lines: int = 25) -> str:
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


def write_atomic(path: Path, text: str, mode: int) -> None:
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
