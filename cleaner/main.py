"""The ``cleaner`` command: backfill an index, run the Cleaner, verify the indexes."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

from schemaless.catalog import IndexState, Topology
from schemaless.connect import open_store
from schemaless.store import DataStore

from .daemon import Cleaner, backfill_name
from .jobs import Supervisor, forwarded_options
from .metrics import Figures
from .priority import lower_priority
from .progress import Progress, end_progress_lines
from .repair import Repairer
from .report import diff_lines
from .runtime import Stopped
from .throttler import ThrottleSettings, parse_load
from .verify import diff_indexes

if TYPE_CHECKING:  # mypy checks cli/ as the top-level package it is in the tree
    from cli.options import (
        CliError,
        Connection,
        Finite,
        Group,
        connection_options,
        inherited_connection,
        metrics_options,
    )
else:  # the CLI's option stack: the same options, errors and redaction
    from schemaless.cli.options import (
        CliError,
        Connection,
        Finite,
        Group,
        connection_options,
        inherited_connection,
        metrics_options,
    )

__all__ = ["main", "worker_args"]

log = logging.getLogger("schemaless.cleaner")

F = TypeVar("F", bound=Callable[..., Any])


def fence_option(fn: F) -> F:
    """``--fence-after``."""
    return click.option(
        "--fence-after",
        type=Finite(min=0),
        default=60.0,
        show_default=True,
        metavar="SECONDS",
        help="Index rows whose version is above their live entity's are removed only "
        "when seen again this much later (0: at once, when no writer is running).",
    )(fn)


#: The exit status of ``--once`` and ``verify`` when logical shards were left pending
#: (their server unavailable) and nothing else failed.
PENDING_EXIT = 3

#: Rows per batch: read, proven and checkpointed together.  With the throttle on, a
#: batch's upserts go in bursts of at most THROTTLED_BURST index rows per server (see
#: docs/cleaner.md, "Burst size"); without it, at once: bigger sorted runs per index
#: table cost the servers less per row.
THROTTLED_BATCH = 2000
THROTTLED_BURST = 250
UNTHROTTLED_BATCH = 8000


def _load(ctx: click.Context, param: click.Parameter, value: str) -> dict[str, int]:
    try:
        return parse_load(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


_THROTTLE_OPTIONS = [
    click.option(
        "--no-throttle",
        is_flag=True,
        help="No adaptive throttle (--rate still caps the rate).",
    ),
    click.option(
        "--max-lag",
        type=Finite(min=0, min_open=True),
        metavar="SECONDS",
        help="Slow down while a replica lags more (default: the store's max_replica_lag, 5 s).",
    ),
    click.option(
        "--critical-load",
        default="Threads_running=50",
        show_default=True,
        callback=_load,
        metavar="VAR=N[,...]",
        help="Pause (not abort) while a server's status variable is at or over N; "
        "resume when under.",
    ),
    click.option(
        "--max-load",
        default="Threads_running=25",
        show_default=True,
        callback=_load,
        metavar="VAR=N[,...]",
        help="Slow down while a server's status variable is at or over N.",
    ),
    click.option(
        "--max-latency-ms",
        type=Finite(min=0, min_open=True),
        metavar="MS",
        help="Slow down while a server's canary p90, or its clients' reported write "
        "p99, is over this (default: 2x the baseline taken at start, at least 6 ms).",
    ),
]


def throttle_options(fn: F) -> F:
    """``--max-latency-ms``, ``--max-load``, ``--critical-load``, ``--max-lag`` and
    ``--no-throttle``, handed to the command as one ``throttle`` (None: off)."""

    @functools.wraps(fn)
    def command(
        *args: Any,
        max_latency_ms: float | None,
        max_load: dict[str, int],
        critical_load: dict[str, int],
        max_lag: float | None,
        no_throttle: bool,
        **kwargs: Any,
    ) -> Any:
        kwargs["throttle"] = (
            None
            if no_throttle
            else ThrottleSettings(max_latency_ms, max_load, critical_load, max_lag)
        )
        return fn(*args, **kwargs)

    for option in _THROTTLE_OPTIONS:
        command = option(command)
    return command  # type: ignore[return-value]


@contextmanager
def _console(quiet: bool, verbose: bool) -> Iterator[None]:
    """Log lines of schemaless to stderr for the duration of the command."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.addFilter(end_progress_lines)  # not after a progress line, on its line
    logger = logging.getLogger("schemaless")
    previous = logger.level
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def _open(conn: Connection) -> DataStore:
    """The datastore (the caller closes it); the group turns errors into one line."""
    return open_store(conn.url, prefix=conn.prefix)


@click.group(
    cls=Group,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@connection_options
@click.option("--index", metavar="NAME", help="Backfill this building index, then exit.")
@click.option(
    "--part",
    callback=lambda ctx, param, value: _parse_part(value),
    metavar="K/N",
    help="With --index: backfill only part K of N (the logical shards with shard % N == "
    "K-1), so N processes or machines share one backfill; the last to finish marks the "
    "index ready.",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 64),
    default=1,
    metavar="N",
    show_default=True,
    help="With --index: run the backfill as N worker processes (parts 1/N .. N/N) with "
    "one progress line and one summary; a worker that dies is started again.",
)
@click.option(
    "--once",
    is_flag=True,
    help=f"Run one full pass and exit (cron, tests); exit status {PENDING_EXIT} if logical "
    "shards were left pending (their server unavailable).",
)
@click.option(
    "--pending-after",
    type=Finite(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Leave a logical shard pending after its server was unavailable this long "
    "(the other shards go on; a later pass or round takes it up again).",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    help="Rows per batch (read, proven and checkpointed together) [default: 2000 with the "
    "throttle, its upserts in bursts of at most 250 rows per server; 8000 with "
    "--no-throttle, at once: writers feel the size of a burst more than the rate].",
)
@click.option(
    "--rate",
    type=Finite(min=0, min_open=True),
    metavar="ROWS_PER_S",
    help="Average rows per second at most, a hard cap over the throttle (default: unlimited).",
)
@throttle_options
@click.option(
    "--interval",
    type=Finite(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Pause between passes when running continuously.",
)
@click.option(
    "--tombstone-retention",
    type=Finite(min=0),
    default=3600.0,
    show_default=True,
    metavar="SECONDS",
    help="Purge tombstones (deleted entities' versions) older than this.",
)
@click.option(
    "--feed-retention",
    type=Finite(min=0),
    default=7 * 24 * 3600.0,
    show_default=True,
    metavar="SECONDS",
    help="Trim change feed rows older than this, even if a subscription still needs them.",
)
@fence_option
@metrics_options
@click.option(
    "--nice",
    type=click.IntRange(0, 19),
    default=10,
    show_default=True,
    help="CPU priority increment: live traffic on the same machine goes first.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress; warnings and errors only.")
@click.option("-v", "--verbose", is_flag=True, help="Debug log lines.")
@click.pass_context
def main(
    ctx: click.Context,
    url: str | None,
    prefix: str,
    index: str | None,
    part: tuple[int, int] | None,
    jobs: int,
    once: bool,
    pending_after: float,
    batch: int | None,
    rate: float | None,
    throttle: ThrottleSettings | None,
    interval: float,
    tombstone_retention: float,
    feed_retention: float,
    fence_after: float,
    metrics_port: int | None,
    metrics_host: str,
    nice: int,
    quiet: bool,
    verbose: bool,
) -> None:
    """The schemaless Cleaner: backfill new indexes, delete orphan index rows.

    \b
    Examples:
      cleaner --index=by_link              # backfill index by_link, then mark it ready
      cleaner --index=by_link --jobs 4     # the same backfill, 4 worker processes
      cleaner --once                       # one pass over every index, then exit
      cleaner --rate 5000 --metrics-port 9187   # run continuously, throttled
      cleaner verify --index by_link       # compare the index with the entities

    Without --index or --once it runs until SIGTERM/SIGINT: the first signal finishes
    the current batch, checkpoints and exits 0; a second one stops at once.
    """
    ctx.ensure_object(dict)
    ctx.obj.update(quiet=quiet, verbose=verbose)
    if ctx.invoked_subcommand is not None:
        return
    if part is not None and index is None:
        raise click.BadParameter("needs --index", param_hint="'--part'")
    if jobs > 1:
        index = _check_jobs(index, part, metrics_port)
        lower_priority(nice)  # the workers inherit it (and lead sessions of their own)
        with _console(quiet, verbose):
            store = _open(Connection(url or None, prefix))
            try:
                _supervise(ctx, store, index, jobs)
            finally:
                store.close()
        return
    lower_priority(nice)
    with _console(quiet, verbose):
        _clean(Connection(url or None, prefix), ctx.params, part or (0, 1), throttle)


def _clean(
    conn: Connection, p: dict[str, Any], part: tuple[int, int], throttle: ThrottleSettings | None
) -> None:
    """The Cleaner in this process (one part of a backfill, one pass, or the daemon)."""
    index = p["index"]
    store = _open(conn)
    try:  # before the Cleaner's heartbeat, which `index status` would show as starting
        _check_indexes(store, [index] if index is not None else [])
    except click.BadParameter:
        store.close()
        raise
    cleaner = Cleaner(
        store,
        batch=p["batch"] or (UNTHROTTLED_BATCH if throttle is None else THROTTLED_BATCH),
        burst=None if throttle is None else THROTTLED_BURST,
        rate=p["rate"],
        interval=p["interval"],
        tombstone_retention=p["tombstone_retention"],
        feed_retention=p["feed_retention"],
        fence_after=p["fence_after"],
        patience=p["pending_after"],
        progress=Progress(sys.stderr, quiet=p["quiet"]),
        name=backfill_name(index, part) if index is not None else None,
        throttle=throttle,
    )
    try:
        cleaner.shutdown.install()
        state = _run(cleaner, index, part, p["once"], p["metrics_port"], p["metrics_host"])
    finally:
        cleaner.shutdown.restore()
        try:
            cleaner.close()
        finally:
            store.close()
    click.echo(cleaner.summary())
    if cleaner.shutdown.requested:
        click.echo("stopped on request; checkpoints saved: run the same command to resume")
    elif p["once"] and index is None and cleaner.rt.pending:
        click.echo(
            f"Pending: {cleaner.pending_text()}: run again when the server is back", err=True
        )
        raise click.exceptions.Exit(PENDING_EXIT)
    elif index is not None and state != IndexState.READY:
        why = f"`schemaless index status {index}` says why"
        if not cleaner.part_done or (cleaner.blocked and part[1] == 1):
            raise CliError(f"index {index!r} is {state}, not ready ({why})")
        done = f"part {part[0] + 1}/{part[1]} done; "
        if cleaner.blocked:  # not a failure of the part: no supervisor starts it again
            click.echo(done + f"index {index} cannot become ready ({why})")
        else:
            click.echo(done + "the index is ready when every part is")


def _check_jobs(index: str | None, part: object, metrics_port: int | None) -> str:
    """``--jobs N`` needs ``--index`` (returned) and excludes ``--part`` and
    ``--metrics-port``."""
    if index is None:
        raise click.BadParameter("needs --index", param_hint="'--jobs'")
    for given, option in ((part, "--part"), (metrics_port, "--metrics-port")):
        if given is not None:
            raise click.BadParameter(f"not with {option}", param_hint="'--jobs'")
    return index


#: Options the supervisor does not pass on as they are (see ``_supervise``).
_OWN = {"url", "prefix", "index", "part", "jobs", "rate", "nice", "quiet", "verbose"}


def worker_args(ctx: click.Context, index: str, jobs: int) -> Callable[[int], list[str]]:
    """Worker K's command line (after the program) for ``--jobs N``: the options given,
    and its share of ``--rate`` (the command's cap is on the workers' sum)."""
    p = ctx.params
    base = ["--index", index, "--nice", "0", "--verbose" if p["verbose"] else "--quiet"]
    base += forwarded_options(ctx, _OWN)
    if p["rate"] is not None:
        base += ["--rate", repr(p["rate"] / jobs)]
    return lambda k: [*base, "--part", f"{k + 1}/{jobs}"]


def _supervise(ctx: click.Context, store: DataStore, index: str, jobs: int) -> None:
    """``--jobs N``: N workers ``--part K/N``; one summary, one exit status."""
    p = ctx.params
    env = dict(os.environ)  # the URL by the environment: no password on a command line
    env.update(
        {k: v for k, v in (("SCHEMALESS_URL", p["url"]), ("SCHEMALESS_PREFIX", p["prefix"])) if v}
    )
    supervisor = Supervisor(
        store,
        index,
        jobs,
        worker_args(ctx, index, jobs),
        env=env,
        progress=Progress(sys.stderr, quiet=p["quiet"]),
    )
    try:
        supervisor.shutdown.install()
        state = supervisor.run()
    finally:
        supervisor.shutdown.restore()
    click.echo(supervisor.summary())
    if supervisor.shutdown.requested:
        click.echo("stopped on request; checkpoints saved: run the same command to resume")
    elif supervisor.failed:
        raise CliError(
            f"{'; '.join(supervisor.failed)}; index {index!r} is {state}: run the same "
            "command to resume"
        )
    elif state != IndexState.READY:
        raise CliError(
            f"index {index!r} is {state}, not ready (`schemaless index status {index}` says why)"
        )


def _parse_part(value: str | None) -> tuple[int, int] | None:
    """``K/N`` (1 <= K <= N) -> ``(K - 1, N)``."""
    if value is None:
        return None
    k, _, n = value.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise click.BadParameter(f"expected K/N with 1 <= K <= N, got {value!r}")
    return int(k) - 1, int(n)


def _run(
    cleaner: Cleaner,
    index: str | None,
    part: tuple[int, int],
    once: bool,
    metrics_port: int | None,
    metrics_host: str,
) -> str | None:
    """The job the options ask for; the index state after a backfill."""
    cleaner.heartbeat()  # "starting": visible before the first batch
    if metrics_port is not None:
        try:
            port = cleaner.serve_metrics(metrics_port, metrics_host)
        except OSError as exc:
            raise click.BadParameter(
                f"cannot listen on {metrics_host}:{metrics_port}: {exc.strerror or exc}",
                param_hint="'--metrics-port'",
            ) from exc
        except ImportError as exc:
            raise click.ClickException(str(exc)) from exc
        log.info("metrics at http://%s:%d/metrics", metrics_host, port)
    try:
        if index is not None:
            return cleaner.backfill(index, part)
        if once:
            cleaner.run_once(full=True)
        else:
            cleaner.run_forever()
    except Stopped:
        cleaner.figures.set(state="stopped")
    return None


@main.command()
@connection_options
@click.option(
    "--index", "names", multiple=True, metavar="NAME", help="Only this index (repeatable)."
)
@click.option("--repair", is_flag=True, help="Fix what was found, then check again.")
@click.option(
    "--examples",
    type=click.IntRange(0),
    default=3,
    show_default=True,
    help="Example rows shown per kind of difference.",
)
@fence_option
@click.pass_context
def verify(
    ctx: click.Context,
    url: str | None,
    prefix: str,
    names: tuple[str, ...],
    repair: bool,
    examples: int,
    fence_after: float,
) -> None:
    """Recompute every index row from the entities and compare with the index tables.

    Reports rows missing (an entity the index would miss), extra (orphans) and behind
    (an older entity_version) per index and shard.  Exit code 0 if clean, 1 if not
    (after --repair: 1 only if differences remain), 3 if clean but for logical shards
    not verified (their server unavailable).  Reads everything: run it on a quiet
    datastore, as concurrent writes show up as passing differences.

    \b
    Examples:
      cleaner verify                      # every index
      cleaner verify --index by_link --repair
    """
    parent = ctx.obj or {}
    with _console(parent.get("quiet", False), parent.get("verbose", False)):
        store = _open(inherited_connection(ctx))
        try:
            dirty, unverified = _verify(store, names, repair, examples, fence_after)
        finally:
            store.close()
    if dirty:
        ctx.exit(1)
    if unverified:
        shards = ", ".join(map(str, sorted(unverified)))
        click.echo(
            f"Pending: logical shard(s) {shards} not verified (server unavailable): "
            "run again when the server is back",
            err=True,
        )
        ctx.exit(PENDING_EXIT)


def _check_indexes(store: DataStore, names: Iterable[str]) -> Topology:
    """The map, read afresh; an error naming the declared indexes unless each of
    ``names`` is one."""
    topo = store.cluster.refresh()
    for name in names:
        if name not in topo.indexes:
            known = ", ".join(sorted(topo.indexes)) or "none"
            raise click.BadParameter(
                f"no index named {name!r} (indexes: {known})", param_hint="'--index'"
            )
    return topo


def _verify(
    store: DataStore, names: tuple[str, ...], repair: bool, examples: int, fence_after: float
) -> tuple[bool, set[int]]:
    """Print the differences (and repair them); whether any remain, and the logical
    shards not verified."""
    topo = _check_indexes(store, names)
    diffs = diff_indexes(store, names or None, partial=True)
    for name, diff in diffs.items():
        for line in diff_lines(topo.indexes[name].index, diff, examples):
            click.echo(line)
    if not diffs:
        click.echo("no indexes to verify")
    dirty = any(not d.clean for d in diffs.values())
    unverified = {s for d in diffs.values() for s in d.unverified}
    if not (repair and dirty):
        return dirty, unverified
    figures = Figures()
    Repairer(store, figures, fence_after=fence_after).repair_diff(topo, diffs)
    f = figures.as_dict()
    click.echo(
        f"repaired: {f['rows_upserted']} rows upserted, {f['orphans_deleted']} deleted, "
        f"{f['fenced']} entities fenced, {f['deferred']} rows deferred (ahead of a live "
        "entity; see --fence-after)"
    )
    again = diff_indexes(store, names or None, partial=True)
    dirty = any(not d.clean for d in again.values())
    click.echo("after repair: " + ("differences remain" if dirty else "clean"))
    if dirty:
        for name, diff in again.items():
            for line in diff_lines(topo.indexes[name].index, diff, examples):
                click.echo(line)
    return dirty, {s for d in again.values() for s in d.unverified}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
