"""Server addresses and credentials.

A server is written ``host:port`` or ``mysql://user:password@host:port``; an IPv6
address in brackets (``[::1]:3306``, ``mysql://u:p@[::1]:3306``).  User and
password may also come from keyword arguments, the ``SCHEMALESS_USER`` and
``SCHEMALESS_PASSWORD`` environment variables, or a MySQL option file.  A password
is never part of a ``repr``, a log line or an error message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from .errors import CatalogError

__all__ = ["Address", "Credentials", "parse_address"]

DEFAULT_PORT = 3306


@dataclass(frozen=True, order=True)
class Address:
    """Where one MySQL server listens."""

    host: str
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class Credentials:
    """Who to connect as; the password never appears in ``repr``."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    option_file: str | None = None

    @classmethod
    def resolve(
        cls,
        user: str | None = None,
        password: str | None = None,
        option_file: str | None = None,
    ) -> Credentials:
        """Explicit values first, then the environment, then the option file (which
        must be a readable file: the driver would skip it and connect as nobody)."""
        named = option_file or os.environ.get("SCHEMALESS_OPTION_FILE")
        if named and not (os.path.isfile(named) and os.access(named, os.R_OK)):
            raise CatalogError(
                f"option file {named!r} (option_file= or SCHEMALESS_OPTION_FILE) is not a"
                " readable file"
            )
        return cls(
            user=user if user is not None else os.environ.get("SCHEMALESS_USER"),
            password=password if password is not None else os.environ.get("SCHEMALESS_PASSWORD"),
            option_file=named,
        )

    def merged(self, other: Credentials) -> Credentials:
        """These credentials with gaps filled from ``other``."""
        return Credentials(
            user=self.user if self.user is not None else other.user,
            password=self.password if self.password is not None else other.password,
            option_file=self.option_file or other.option_file,
        )

    def connect_kwargs(self) -> dict[str, str]:
        """Keyword arguments for ``MySQLdb.connect``."""
        kwargs: dict[str, str] = {}
        if self.option_file:
            kwargs["read_default_file"] = self.option_file
            kwargs["read_default_group"] = "client"
        if self.user is not None:
            kwargs["user"] = self.user
        if self.password is not None:
            kwargs["password"] = self.password
        return kwargs


def parse_address(spec: str) -> tuple[Address, Credentials]:
    """Parse ``host:port`` or ``mysql://user:password@host:port`` (IPv6 in brackets)."""
    if not isinstance(spec, str) or not spec.strip():
        raise CatalogError(f"invalid server address {type(spec).__name__!s}: expected host:port")
    text = spec.strip()
    if "://" in text:
        return _parse_url(text)
    if any(c in text for c in "@/ \t\n"):
        shown = "***" + text[text.rindex("@") :] if "@" in text else text
        raise CatalogError(
            f"invalid server address {shown!r}: expected host:port, or "
            "mysql://user:password@host:port"
        )
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest or str(DEFAULT_PORT)
        ok = bool(sep) and ":" in host and (not rest or rest.startswith(":"))
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, str(DEFAULT_PORT)
        ok = ":" not in host
    if not ok or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        ipv6 = text.count(":") > 1 and not text.startswith("[")
        hint = "; an IPv6 address goes in brackets: [::1]:3306" if ipv6 else ""
        raise CatalogError(f"invalid server address {text!r}: expected host:port{hint}")
    return Address(host, int(port_text)), Credentials()


def _parse_url(text: str) -> tuple[Address, Credentials]:
    """``mysql://user:password@host:port``: nothing after the port (a database or options
    would be silently ignored, so they are refused)."""
    try:
        parts = urlsplit(text)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        raise CatalogError(f"invalid server address {_redact(text)!r}") from None
    if parts.scheme not in ("mysql", "mariadb"):
        raise CatalogError(f"invalid server address scheme {parts.scheme!r}: use mysql://")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise CatalogError(f"invalid port in server address {_redact(text)!r}") from None
    if not parts.hostname:
        raise CatalogError(f"missing host in server address {_redact(text)!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise CatalogError(
            f"server address {_redact(text)!r} has a path or options after the port: "
            "write mysql://user:password@host:port (the datastore is named by --prefix)"
        )
    creds = Credentials(
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )
    return Address(parts.hostname, port), creds


def _redact(text: str) -> str:
    """The address with any password replaced by ``***``."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return "***" + text[text.rindex("@") :] if "@" in text else text
    if parts.password is None:
        return text
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
