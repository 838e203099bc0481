"""Read replicas of a local cluster's servers.

A replica is a mariadbd of its own (``replica<j>/``, ``server_id`` 1001 + j,
``read_only``) replicating one primary with GTIDs.  The application user may only
SELECT there (and read SHOW REPLICA STATUS), so a misrouted write fails loudly.
A primary with a replica writes a ROW binlog; a cluster that asks for replicas at
creation (``replicas=N``) has it from its first start.  Replication begins at the
primary's current GTID position and nothing is copied, so a primary must not hold
any database when its replica is set up (seed one with mariadb-backup otherwise).
"""

from __future__ import annotations

import configparser
import logging
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from ..errors import LocalClusterError
from .server import HOST, LocalServer, find_mariadbd, write_atomic
from .users import APP_USER, Users

__all__ = ["REPLICATION_USER", "Replicas"]

logger = logging.getLogger(__name__)

REPLICATION_USER = "schemaless_repl"


class Replicas(Users):
    """Adding, starting, stopping and watching read replicas."""

    def add_replica(self, of: int = 0, timeout: float = 60.0) -> LocalServer:
        """Add a read replica of server ``of``, start it, wait until it replicates.

        Server ``of`` must be running and hold no database yet; if it runs without a
        binary log it is restarted with one.
        """
        deadline = time.monotonic() + timeout
        mariadbd = find_mariadbd()
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
        mariadbd = find_mariadbd()
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

    def _forget_replica(self, replica: LocalServer) -> None:
        """Undo a replica that could not be set up: stop it, remove its files."""
        self._stop([replica], 60.0)
        shutil.rmtree(replica.datadir.parent, ignore_errors=True)
        self.replicas = [r for r in self.replicas if r.pidfile != replica.pidfile]
        self._save_state()

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
        for host in (HOST, "localhost"):
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
            write_atomic(self.replication_file, text, 0o600)
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
                (f"CREATE OR REPLACE USER '{user}'@'{HOST}' IDENTIFIED BY %s", (password,)),
                (f"GRANT REPLICATION SLAVE ON *.* TO '{user}'@'{HOST}'", None),
                ("SELECT @@gtid_binlog_pos AS pos", None),
            ],
            deadline,
            secret=password,
        )[-1][0]["pos"]
        change = (
            "CHANGE MASTER TO MASTER_HOST = %s, MASTER_PORT = %s, MASTER_USER = %s,"
            " MASTER_PASSWORD = %s, MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1"
        )
        params: tuple[Any, ...] = (HOST, primary.port, user, password)
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
