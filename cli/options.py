"""Shared options, the connection, and error handling for every command of
``schemaless`` and of ``cleaner``.

Connection: ``--url`` (or ``$SCHEMALESS_URL``), the DSN of the catalog server (the
first server of the datastore), and ``--prefix`` (or ``$SCHEMALESS_PREFIX``).  User and
password come from the DSN or ``$SCHEMALESS_USER``/``$SCHEMALESS_PASSWORD`` (or
``$SCHEMALESS_OPTION_FILE``); with neither a URL nor servers, the local cluster
(``$SCHEMALESS_LOCAL_DIR``) and its option file.  A password is never printed.

Errors: a ``SchemalessError`` (a local cluster's error too) becomes one line on stderr and
exit status 1; a bad option value is a :class:`BadOption` that names the option.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import click

from schemaless.connect import DEFAULT_PREFIX, open_store
from schemaless.dsn import parse_address
from schemaless.errors import CatalogError, SchemalessError
from schemaless.schema import check_prefix
from schemaless.store import DataStore

__all__ = [
    "BadOption",
    "CliError",
    "Connection",
    "Group",
    "connection_options",
    "follow_up",
    "inherited_connection",
    "one_line",
    "pass_connection",
]

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """A domain error: printed as ``Error: <one line>``, exit status 1."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(one_line(redact(message)))


class BadOption(click.BadParameter):
    """A bad option value: one line naming the option, exit status 1."""

    exit_code = 1

    def __init__(self, message: str, option: str) -> None:
        super().__init__(one_line(redact(message)), param_hint=f"'{option}'")

    def show(self, file: Any = None) -> None:
        click.echo(f"Error: {self.format_message()}", file=file, err=True)


def one_line(message: str) -> str:
    """The first non-empty line of a message, without a dangling colon."""
    for line in message.splitlines():
        if line.strip():
            return line.strip().rstrip(":;").strip()
    return "unknown error"


def _secrets() -> list[str]:
    """Passwords this process may know: ``$SCHEMALESS_PASSWORD`` and the URL's."""
    found = []
    env = os.environ.get("SCHEMALESS_PASSWORD")
    if env:
        found.append(env)
    url = os.environ.get("SCHEMALESS_URL") or ""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        given = ctx.params.get("url")
        if isinstance(given, str):
            url = given
        servers = ctx.params.get("server") or ()
        found += [p for p in (_url_password(s) for s in servers) if p]
        ctx = ctx.parent
    pw = _url_password(url)
    if pw:
        found.append(pw)
    return found


def _url_password(url: str) -> str | None:
    if "://" not in url:
        return None
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return unquote(password) if password else None


def redact(message: str) -> str:
    """``message`` with every known password replaced by ``***`` (belt and braces:
    the library never puts one in a message)."""
    for secret in sorted(_secrets(), key=len, reverse=True):
        if len(secret) >= 3:
            message = message.replace(secret, "***")
    return message


class Group(click.Group):
    """A click group that turns library errors into one-line CLI errors."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SchemalessError as exc:
            raise CliError(str(exc)) from exc


# -- the connection ---------------------------------------------------------------------


def _check_prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_prefix(value)
    except CatalogError as exc:
        raise BadOption(str(exc), "--prefix") from None


def connection_options(f: F) -> F:
    """``--url`` and ``--prefix``, with their environment variables."""
    f = click.option(
        "--prefix",
        envvar="SCHEMALESS_PREFIX",
        default=DEFAULT_PREFIX,
        show_default=True,
        show_envvar=True,
        callback=_check_prefix,
        help="Datastore name: its databases are <prefix>_catalog and <prefix>_NNNN.",
    )(f)
    f = click.option(
        "--url",
        envvar="SCHEMALESS_URL",
        metavar="DSN",
        show_envvar=True,
        help="Catalog server (the first server): host:port or mysql://user:pw@host:port; "
        "user and password also from SCHEMALESS_USER, SCHEMALESS_PASSWORD. "
        "Default: the local cluster.",
    )(f)
    return f


@dataclass(frozen=True)
class Connection:
    """Where the datastore is: a URL (or the local cluster) and a prefix."""

    url: str | None
    prefix: str

    @contextmanager
    def store(
        self, *, servers: Sequence[str] = (), create: bool = False, **kwargs: Any
    ) -> Iterator[DataStore]:
        """An open datastore, closed at the end of the block."""
        ds = open_store(self.url, servers=servers, prefix=self.prefix, create=create, **kwargs)
        try:
            yield ds
        finally:
            ds.close()


def pass_connection(f: F) -> F:
    """Add the connection options and pass a :class:`Connection` as ``conn``."""

    @connection_options
    @functools.wraps(f)
    def wrapper(*args: Any, url: str | None, prefix: str, **kwargs: Any) -> Any:
        return f(*args, conn=Connection(url or None, prefix), **kwargs)

    return wrapper  # type: ignore[return-value]


def inherited_connection(ctx: click.Context) -> Connection:
    """The connection of a subcommand that repeats its group's connection options
    (``cleaner verify``): an option left at its default takes the group's value."""
    parent = ctx.parent.params if ctx.parent is not None else {}
    default = click.core.ParameterSource.DEFAULT

    def value(name: str) -> Any:
        if ctx.get_parameter_source(name) in (None, default) and name in parent:
            return parent[name]
        return ctx.params.get(name)

    return Connection(value("url") or None, value("prefix"))


def follow_up(program: str, *args: str) -> str:
    """A command line to run next with the same connection as this command.

    Connection options given on this command line are repeated (the URL as
    ``host:port``, never with its password); those from the environment are not.
    """
    words = [program, *args]
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        given = click.core.ParameterSource.COMMANDLINE
        url, prefix = ctx.params.get("url"), ctx.params.get("prefix")
        if isinstance(url, str) and ctx.get_parameter_source("url") == given:
            with suppress(CatalogError):
                words.append(f"--url {parse_address(url)[0]}")
        if isinstance(prefix, str) and ctx.get_parameter_source("prefix") == given:
            words.append(f"--prefix {prefix}")
    return " ".join(words)
