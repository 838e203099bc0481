"""The application user of a local cluster, and statements run as root."""

from __future__ import annotations

import configparser
import getpass
import logging
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import MySQLdb

from ..errors import LocalClusterError
from .process import Processes
from .server import HOST, HOST6, LocalServer, write_atomic

__all__ = ["APP_USER", "Users"]

logger = logging.getLogger(__name__)

APP_USER = "schemaless"


class Users(Processes):
    """The application user (its password only in ``client.cnf``) and root access
    over a server's socket."""

    def _marker(self, s: LocalServer) -> Path:
        return s.datadir.parent / ".app-user-v2"  # v2: also at ::1

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
            write_atomic(self.option_file, text + f"password={password}\n", 0o600)
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
        statements = []
        for host in (HOST, HOST6, "localhost"):
            statements += [
                f"CREATE OR REPLACE USER '{APP_USER}'@'{host}' IDENTIFIED BY %s",
                f"GRANT ALL PRIVILEGES ON *.* TO '{APP_USER}'@'{host}' WITH GRANT OPTION",
            ]
        self._as_root(
            s,
            [(sql, (password,) if "%s" in sql else None) for sql in statements],
            deadline,
            secret=password,
        )
        logger.info("application user %r ready on server %d", APP_USER, s.index)

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
