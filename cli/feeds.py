"""``schemaless feeds``: a timeline's tables and its fan-out worker (schemaless.feeds)."""

from __future__ import annotations

import signal
import threading

import click

from schemaless import DataStore
from schemaless.errors import SchemalessError, TransientError
from schemaless.feeds import Feeds

from .feeds_metrics import WorkerFigures, serving
from .options import Connection, Finite, group_connection, metrics_options, pass_connection

__all__ = ["feeds"]

#: Seconds the worker waits after a server's outage stopped a round, before resuming.
RETRY_AFTER = 2.0


@click.group()
@group_connection
def feeds() -> None:
    """Timelines (schemaless.feeds): their tables and the fan-out worker.

    \b
    Example:
        schemaless feeds create home
        schemaless feeds work home
        schemaless feeds work home --once --pull-threshold 5000
        schemaless feeds trim home --keep 800
    """


@feeds.command()
@click.argument("name")
@pass_connection
def create(conn: Connection, name: str) -> None:
    """Turn the change feed on and create the tables of timeline NAME and of its
    follow graph on every server: an admin's step before the application's user, which
    has no DDL, uses the timeline (then re-run `schemaless grants app --apply`: the
    change feed's subscriptions need their grant).

    \b
    Example:
        schemaless feeds create home
    """
    with conn.store() as ds:
        try:
            Feeds(ds, name, create=False).create()
            servers = len(ds.cluster.current().servers)
        except SchemalessError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"feed {name!r}: change feed on, tables on {servers} servers")


@feeds.command()
@click.argument("name")
@click.option("--once", is_flag=True, help="Stop once every post so far is fanned out.")
@click.option(
    "--pull-threshold",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Authors with more followers are pulled at read time, not fanned out.",
)
@click.option(
    "--poll",
    type=Finite(min=0),
    default=0.2,
    show_default=True,
    help="Seconds between empty rounds.",
)
@metrics_options
@pass_connection
def work(
    conn: Connection,
    name: str,
    once: bool,
    pull_threshold: int,
    poll: float,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Fan the posts of feed NAME out into followers' timelines, from the change
    feed (subscription feeds_NAME: a restart resumes where it stopped).  A server's
    outage prints a warning: the followers on the other servers still get new posts,
    the rest once it answers (--once: exit 1 when caught up).  SIGTERM or a first
    Ctrl-C stops it after its round, exit 0 (a second Ctrl-C at once).  --metrics-port
    serves its figures (posts, rounds, what it owes, seconds behind, its state) for
    Prometheus.

    \b
    Example:
        schemaless feeds work home --once
        schemaless feeds work home --metrics-port 9188
    """
    figures = WorkerFigures(name)
    with conn.store() as ds, serving(figures, metrics_port, metrics_host):
        try:
            n = _work(_existing(ds, name, pull_threshold), once, poll, figures)
        except TransientError as exc:  # --once, caught up on the servers that answer
            raise click.ClickException(
                f"{exc}; the posts for the followers on the other servers are fanned out,"
                " the rest is owed: run it again once the server answers"
            ) from None
        except SchemalessError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            return
    click.echo(f"feed {name!r}: {n} posts fanned out")


def _work(feed: Feeds, once: bool, poll: float, figures: WorkerFigures) -> int:
    """Run the worker; it fans out to the servers that answer and warns when one does
    not (retrying its part); without ``once`` it also rides out an error that stops it
    (a transient one), resuming from its subscription (a round redone doubles nothing)."""

    def warn(exc: SchemalessError) -> None:
        click.echo(f"warning: {exc}; fanning out to the other servers, retrying its part", err=True)

    stopping = threading.Event()  # SIGTERM or a first Ctrl-C: stop after the round, exit 0

    def interrupted(*_: object) -> None:  # a second Ctrl-C interrupts at once
        stopping.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    previous_int = signal.signal(signal.SIGINT, interrupted)
    try:
        while True:
            try:
                return feed.work(
                    once=once,
                    poll=poll,
                    stop=stopping.is_set,
                    warn=None if once else warn,
                    progress=figures.round,
                )
            except TransientError as exc:
                if once:
                    raise
                click.echo(f"warning: {exc}; resuming in {RETRY_AFTER:g}s", err=True)
                figures.failing()
                if stopping.wait(RETRY_AFTER):
                    return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


@feeds.command()
@click.argument("name")
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Inbox rows kept for each reader, newest.",
)
@pass_connection
def trim(conn: Connection, name: str, keep: int) -> None:
    """Delete the inbox rows of feed NAME beyond each reader's newest KEEP (run it
    from cron: a timeline otherwise keeps every row it was given).

    \b
    Example:
        schemaless feeds trim home --keep 800
    """
    with conn.store() as ds:
        try:
            n = _existing(ds, name).trim(keep)
        except SchemalessError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"feed {name!r}: {n} inbox rows deleted, at most {keep} kept per reader")


def _existing(ds: DataStore, name: str, pull_threshold: int = 1000) -> Feeds:
    """Feed ``name``, whose tables an admin made (`feeds create`): a mistyped name is
    an error, never a new feed."""
    feeds = Feeds(ds, name, pull_threshold=pull_threshold, create=False)
    if not feeds.exists():
        raise click.ClickException(
            f"unknown feed {name!r}: its tables do not exist (`schemaless feeds create"
            f" {name}` makes them)"
        )
    return feeds
