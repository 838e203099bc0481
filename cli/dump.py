"""``schemaless dump DIR`` and ``schemaless restore DIR`` (``schemaless.dump``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from schemaless.cleaner.daemon import Cleaner
from schemaless.dump import (
    ENCODINGS,
    Settings,
    TableDump,
    dump,
    dump_directory,
    read_manifest,
    restore,
    table_dumps,
)
from schemaless.results import scalar
from schemaless.store import DataStore

from .options import Connection, follow_up, pass_connection

__all__ = ["dump_command", "restore_command"]

workers_option = click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Logical shards (dump files) handled at once.",
)


@contextmanager
def _bar(length: int, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (only the label when it is not a terminal)."""
    bar = click.progressbar(length=max(1, length), label=label, file=sys.stderr)
    with bar:
        yield bar.update


@click.command("dump")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option(
    "--format",
    "encoding",
    type=click.Choice(ENCODINGS),
    default="jsonl",
    show_default=True,
    help="jsonl: portable JSON lines; native: the stored bodies as they are (faster).",
)
@workers_option
@pass_connection
def dump_command(conn: Connection, directory: str, encoding: str, workers: int) -> None:
    """Dump every live entity (id, body, version), the index definitions, the
    datastore's settings (expiry property, change feed) and the rows of its edge
    types and feeds (schemaless.edges, schemaless.feeds) into DIR.

    Each logical shard is read in its own consistent snapshot, several at once;
    DIR must not hold a dump already.  `schemaless restore DIR` loads it into a
    datastore of any shard count and layout: dump a datastore of the databases
    layout and restore it into a new one to move it to the owned layout.

    \b
    Example:
        schemaless dump ./backup-2024-06-01
        schemaless dump ./fast --format native --workers 8
    """
    started = time.monotonic()
    dump_directory(directory)  # its errors before the progress bar
    with conn.store() as ds, _bar(_estimate(ds), "dumping") as progress:
        manifest = dump(ds, directory, encoding=encoding, workers=workers, progress=progress)
    n = sum(manifest["files"].values())
    click.echo(
        f"dumped {n} entities and {len(manifest['indexes'])} index definitions from "
        f"{manifest['shards']} logical shards into {directory} in {time.monotonic() - started:.1f}s"
    )
    _tables_line("dumped", table_dumps(manifest))


@click.command("restore")
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--no-backfill",
    is_flag=True,
    help="Leave the indexes building, for `cleaner --index=NAME` to backfill.",
)
@workers_option
@pass_connection
def restore_command(conn: Connection, directory: str, no_backfill: bool, workers: int) -> None:
    """Restore a dump into the datastore (entities, then edge and feed rows, each
    on the logical shard of its node), then declare and backfill its indexes.

    The datastore may have any shard count and servers (create it first with
    `schemaless init`); it must be empty, or hold an interrupted restore of the
    same dump: running the command again finishes it, without duplicates.  It
    gets the dump's expiry property and change feed; a datastore set otherwise
    is refused.

    \b
    Example:
        schemaless init --shards 64 --server db1:3306 --server db2:3306
        schemaless restore ./backup-2024-06-01
        schemaless init --prefix app2 && schemaless restore ./app-dump --prefix app2
    """
    started = time.monotonic()
    manifest = read_manifest(directory)
    total = sum(manifest["files"].values())
    tables = table_dumps(manifest)
    settings = Settings.of(manifest)
    with conn.store() as ds:
        with _bar(total + _rows(tables), "restoring") as progress:
            building = restore(ds, directory, workers=workers, progress=progress)
        click.echo(f"restored {total} entities in {time.monotonic() - started:.1f}s")
        _tables_line("restored", tables)
        if settings is not None:
            click.echo(_settings_line(settings))
        for name in building:
            if no_backfill:
                click.echo(
                    f"index {name} is building: run {follow_up('cleaner', '--index=' + name)}"
                )
                continue
            state = Cleaner(ds).backfill(name)
            click.echo(f"index {name}: {state}")


def _tables_line(done: str, tables: list[TableDump]) -> None:
    """The edge and feed tables' rows, when the dump has any."""
    if tables:
        names = ", ".join(t.name for t in tables)
        click.echo(f"{done} {_rows(tables)} rows of {len(tables)} edge and feed tables: {names}")


def _rows(tables: list[TableDump]) -> int:
    return sum(n for t in tables for n in t.files.values())


def _settings_line(settings: Settings) -> str:
    expiry = settings.expire_on
    expires = "never expire" if expiry is None else f"expire at the time in {expiry!r}"
    return f"settings: entities {expires}; change feed {'on' if settings.changes else 'off'}"


def _estimate(ds: DataStore) -> int:
    """The servers' estimate of the entity rows (for the progress bar only)."""
    topo = ds.cluster.refresh()
    total = 0
    for sid, server in ds.cluster.all_servers(topo).items():
        dbs = sorted({topo.dbs[s] for s in topo.shards_of(sid)})  # owned layout: one
        if dbs:
            rows = server.run(
                "SELECT COALESCE(SUM(TABLE_ROWS), 0) FROM information_schema.TABLES"
                " WHERE TABLE_NAME = 'entities' AND TABLE_SCHEMA IN ("
                + ", ".join(["%s"] * len(dbs))
                + ")",
                dbs,
            )
            total += int(scalar(rows[0]))
    return total
