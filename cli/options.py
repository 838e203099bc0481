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
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar
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
    "Finite",
    "Group",
    "connection_options",
    "follow_up",
    "inherited_connection",
    "metrics_options",
    "needs_partial",
    "one_line",
    "pass_connection",
]

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """A domain error: printed as ``Error: <one line>``, exit status 1."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(one_line(redact(message)))


def needs_partial(exc: Exception) -> CliError:
    """The error of a command refused for a server that does not answer, naming the
    option that reads the others instead."""
    return CliError(f"{exc}; `--partial` reads the servers that answer")


class BadOption(click.BadParameter):
    """A bad option value: one line naming the option, exit status 1."""

    exit_code = 1

    def __init__(self, message: str, option: str) -> None:
        super().__init__(one_line(redact(message)), param_hint=f"'{option}'")

    @classmethod
    def of(cls, exc: click.BadParameter) -> BadOption:
        """Click's own bad value (``--limit 0``: exit 2, with the usage) as one line,
        exit 1, like every other bad option value."""
        out = cls(exc.message, "")
        out.ctx, out.param, out.param_hint = exc.ctx, exc.param, exc.param_hint
        return out

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
    """A click group that turns library errors into one-line CLI errors, and a bad
    option value (its own or a subcommand's) into a :class:`BadOption`.  Mistyped
    command lines (an unknown option, a missing argument) stay click's usage errors,
    exit status 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.BadParameter as exc:
            _raise_bad_option(exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SchemalessError as exc:
            raise CliError(str(exc)) from exc
        except click.BadParameter as exc:
            _raise_bad_option(exc)


def _raise_bad_option(exc: click.BadParameter) -> NoReturn:
    if isinstance(exc, BadOption | click.MissingParameter):
        raise exc
    raise BadOption.of(exc) from exc


# -- value types and option groups shared by commands (the Cleaner's too) --------------


class Finite(click.FloatRange):
    """A ``FloatRange`` that also refuses ``nan`` and ``inf``, which pass its bounds
    (``--tombstone-retention nan`` was a traceback)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def metrics_options(command: F) -> F:
    """A command's ``--metrics-port`` and ``--metrics-host`` (a Prometheus endpoint)."""
    port = click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        metavar="PORT",
        help="Serve Prometheus figures at http://HOST:PORT/metrics (0: any free port).",
    )
    host = click.option(
        "--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port."
    )
    return port(host(command))


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
        help="Datastore name: its databases are <prefix>_catalog and <prefix>_data"
        " (<prefix>_NNNN per shard in a datastore made before the owned layout).",
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
    """Add the connection options and pass a :class:`Connection` as ``conn`` (the
    options may also be given to a group before the command)."""

    @connection_options
    @functools.wraps(f)
    def wrapper(*args: Any, url: str | None, prefix: str, **kwargs: Any) -> Any:
        return f(*args, conn=inherited_connection(click.get_current_context()), **kwargs)

    return wrapper  # type: ignore[return-value]


def group_connection(f: F) -> F:
    """Add the connection options to a group of commands (``schemaless index --prefix
    app list``): they are read by its commands, as a group above them would be."""

    @connection_options
    @functools.wraps(f)
    def wrapper(*args: Any, url: str | None, prefix: str, **kwargs: Any) -> Any:
        return f(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _given(ctx: click.Context, name: str) -> Any:
    """An option of the command or of a group above it (``schemaless --prefix app get``
    and ``schemaless get --prefix app`` alike): the innermost one given on the command
    line, else the command's own value (from the environment, or the default)."""
    at = _where_given(ctx, name)
    return (at or ctx).params.get(name)


def _where_given(ctx: click.Context, name: str) -> click.Context | None:
    """The innermost context (the command's, or a group's) given ``name`` on the
    command line; None if none was."""
    at: click.Context | None = ctx
    while at is not None:
        if at.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            return at
        at = at.parent
    return None


def inherited_connection(ctx: click.Context) -> Connection:
    """The connection of a command whose connection options may also be given to its
    group (``cleaner --prefix app verify``, ``schemaless --prefix app get``)."""
    return Connection(_given(ctx, "url") or None, _given(ctx, "prefix"))


def follow_up(program: str, *args: str) -> str:
    """A command line to run next with the same connection as this command.

    Connection options given on this command line are repeated (the URL as
    ``host:port``, never with its password); those from the environment are not.
    """
    words = [program, *args]
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        at_url, at_prefix = _where_given(ctx, "url"), _where_given(ctx, "prefix")
        url = at_url.params["url"] if at_url else None
        prefix = at_prefix.params["prefix"] if at_prefix else None
        if isinstance(url, str):
            with suppress(CatalogError):
                words.append(f"--url {parse_address(url)[0]}")
        if isinstance(prefix, str):
            words.append(f"--prefix {prefix}")
    return " ".join(words)
