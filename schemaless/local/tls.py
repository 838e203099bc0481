"""The certificates of a TLS local cluster (a CA and a server certificate)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import LocalClusterError

__all__ = ["make_certificates"]


def make_certificates(tls_dir: Path) -> None:
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
