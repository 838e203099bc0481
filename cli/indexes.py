"""``schemaless index``: declare, list, watch and drop indexes."""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

import click

from schemaless.catalog import IndexInfo, IndexState
from schemaless.errors import (
    IndexDefinitionError,
    IndexDoesNotFit,
    PermissionDenied,
    TransientError,
)
from schemaless.index import Index, parse_type
from schemaless.store import DataStore

from .dry_run import show_dry_run
from .index_report import describe, echo_report, index_report, info_json, percent
from .options import (
    BadOption,
    CliError,
    Connection,
    Finite,
    Group,
    follow_up,
    group_connection,
    pass_connection,
)
from .output import echo_table, json_line, warn_unreachable
from .stats import (
    Backfill,
    added_ranges,
    backfill,
    heartbeats,
)
from .where import literal

__all__ = ["index"]

_PROPERTY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def _check_filter(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, Any] | None:
    """``--where NAME=VALUE`` (repeatable) as a partial index's filter; a VALUE is
    read as ``query --where`` reads one for an ``auto`` column."""
    out: dict[str, Any] = {}
    for spec in values:
        name, sep, text = spec.partition("=")
        name = name.strip()
        if not sep or not _PROPERTY.match(name):
            raise BadOption(f"{spec!r}: expected NAME=VALUE (NAME may be a path a.b)", "--where")
        if name in out:
            raise BadOption(f"{spec!r}: a second value for {name!r}", "--where")
        try:
            out[name] = literal(text, "auto")
        except ValueError as exc:
            raise BadOption(f"{spec!r}: {exc}", "--where") from None
    return out or None


def _check_properties(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[str]:
    out = []
    for spec in values:
        name, sep, type_text = spec.partition(":")
        name = name.strip()
        if not _PROPERTY.match(name):
            raise BadOption(
                f"{spec!r}: a property is NAME or NAME:TYPE, NAME of letters, digits and '_' "
                "(a nested path: NAME.NAME, e.g. author.id)",
                "--property",
            )
        if sep:
            try:
                parse_type(type_text)
            except IndexDefinitionError as exc:
                raise BadOption(f"{spec!r}: {exc}", "--property") from None
        out.append(f"{name}:{type_text.strip()}" if sep else name)
    return out


@click.group(cls=Group)
@group_connection
def index() -> None:
    """Declare, list, watch and drop indexes.

    \b
    Example:
        schemaless index create by_user --property user_id:uuid \\
            --property published:int --shard-on user_id
        schemaless index status by_user
    """


@index.command()
@click.argument("name")
@click.option(
    "--property",
    "properties",
    multiple=True,
    required=True,
    metavar="NAME[:TYPE]",
    callback=_check_properties,
    help="An indexed property, in index order (repeatable). TYPE: uuid, int, float, "
    "bool, str(N), bytes(N) or auto (the default: any scalar).",
)
@click.option("--shard-on", metavar="NAME", help="Property that places the rows (default: first).")
@click.option("--multi", metavar="NAME", help="A list-valued property: one row per element.")
@click.option(
    "--where",
    "filter_",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_check_filter,
    help="A partial index: rows only for entities whose NAME (a property or path) "
    "equals VALUE (repeatable: all must hold). VALUE as in `query --where`.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Declare nothing: sample the stored entities and estimate the index rows, "
    "size, unindexable entities (with examples) and the backfill's ETA.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@click.option(
    "--force",
    is_flag=True,
    help="Declare it even if sampled entities have values that do not fit the types or "
    "(--unique) share a value: it then stays building until they are fixed.",
)
@click.option(
    "--unique",
    is_flag=True,
    help="At most one live entity per tuple of values (a put that would share one fails "
    "with UniqueViolation).",
)
@click.option(
    "--counted",
    is_flag=True,
    help="Keep a count per equality prefix, updated with each write, for `schemaless count` "
    "(owned layout).",
)
@pass_connection
def create(
    conn: Connection,
    name: str,
    properties: list[str],
    shard_on: str | None,
    multi: str | None,
    filter_: dict[str, Any] | None,
    dry_run: bool,
    as_json: bool,
    force: bool,
    unique: bool,
    counted: bool,
) -> None:
    """Declare an index: create its table on every shard and record it.

    On a datastore that holds entities the index is "building": writers maintain
    it from their next catalog refresh, queries refuse it until the Cleaner has
    backfilled it (run `cleaner --index=NAME`, watch `schemaless index status
    NAME`).  On an empty datastore it is ready at once.  Declaring the same index
    again changes nothing.  Quote types with parentheses for the shell.  With
    --dry-run nothing is declared: a sample of the stored entities tells how
    many rows the index would hold, its size, which entities have values that
    do not fit the types, and how long the backfill would take.  Without --dry-run
    the same kind of sample is checked first: if entities have values that do not
    fit the types or (--unique) share a value, nothing is declared and the command
    exits 1 with counts and examples; --force declares it anyway, and it stays
    building (`index status` shows why) until they are fixed and the backfill runs
    again.  Writes never fail because of a building index.

    \b
    Example:
        schemaless index create by_user --property user_id:uuid \\
            --property published:int --shard-on user_id --dry-run
        schemaless index create by_user --property user_id:uuid \\
            --property published:int --shard-on user_id
        schemaless index create by_tag --property tags:'str(64)' --multi tags
        schemaless index create by_email --property email:'str(254)' --unique
        schemaless index create posts_by_user --property user_id:uuid --where kind=post
        schemaless index create likes_by_entry --property entry_id:uuid --counted
    """
    definition = _definition(name, properties, shard_on, multi, unique, filter_, counted)
    with conn.store() as ds:
        if dry_run:
            show_dry_run(ds, definition, as_json)
            return
        existed = ds.cluster.refresh().indexes.get(name)
        state = _declare(ds, definition, force)
        refresh = ds.cluster.topology.refresh_interval
    if as_json:
        shown = {"definition": definition.to_dict(), "existed": existed is not None}
        click.echo(json.dumps({**shown, "state": state}, sort_keys=True))
        return
    _echo_created(definition, existed is not None, state, refresh)


def _declare(ds: DataStore, definition: Index, force: bool) -> str:
    """``declare_index``, its refusals as one-line errors."""
    try:
        return ds.declare_index(definition, force=force)
    except IndexDoesNotFit as exc:  # the examples on stdout, the counts as the error
        click.echo(f"index {definition.name}: nothing declared; e.g.")
        for line in exc.examples:
            click.echo(line)
        raise CliError(exc.summary) from None
    except TransientError as exc:  # a server down: the dry run samples the others
        raise CliError(
            f"{exc}; index create needs every server (it makes the index's tables on"
            " each): run it again once they all answer (--dry-run works meanwhile)"
        ) from None
    except PermissionDenied as exc:  # the application's user: no DDL
        raise CliError(
            f"{exc}; index create makes tables on every server and records the index in"
            " the catalog: run it as the datastore's admin (`schemaless grants admin`)"
        ) from None


def _definition(
    name: str,
    properties: list[str],
    shard_on: str | None,
    multi: str | None,
    unique: bool,
    filter_: dict[str, Any] | None = None,
    counted: bool = False,
) -> Index:
    """The index ``index create`` declares; a bad option is named."""
    names = [p.partition(":")[0] for p in properties]
    for option, value in (("--shard-on", shard_on), ("--multi", multi)):
        if value is not None and value not in names:
            raise BadOption(
                f"{value!r} is not one of the --property names ({', '.join(names)})", option
            )
    try:
        Index(name, ["x"])  # the name alone
    except IndexDefinitionError as exc:
        raise BadOption(str(exc), "NAME") from None
    definition = Index(name, properties, shard_on, multi=multi, unique=unique, counted=counted)
    if filter_ is None:
        return definition
    try:
        return Index(
            name, properties, shard_on, multi=multi, unique=unique, where=filter_, counted=counted
        )
    except IndexDefinitionError as exc:
        raise BadOption(str(exc), "--where") from None


def _echo_created(definition: Index, existed: bool, state: str, refresh: float) -> None:
    """What ``index create`` did, and what to run next."""
    name, multi, unique = definition.name, definition.multi, definition.unique
    click.echo(
        f"index {name}: {describe(definition)}, shard on {definition.shard_on}"
        + (f", multi {multi}" if multi else "")
        + (", unique" if unique else "")
    )
    if existed:
        click.echo(f"index {name} already exists and is {state}; nothing changed")
    elif state == IndexState.READY:
        click.echo(f"index {name} is ready (no entities to backfill): queries can use it now")
    else:
        click.echo(
            f"index {name} is building: writers maintain it within {refresh:g}s; "
            "queries refuse it until it is backfilled"
        )
    if state == IndexState.BUILDING:
        click.echo("next: backfill it with the Cleaner, then watch it:")
        click.echo("  " + follow_up("cleaner", f"--index={name}"))
        click.echo("  " + follow_up("schemaless index status", name))


@index.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="JSON lines, for scripts.")
@pass_connection
def list_(conn: Connection, as_json: bool) -> None:
    """List the indexes with their state and backfill progress.

    \b
    Example:
        schemaless index list
    """
    with conn.store() as ds:
        infos = sorted(ds.indexes().values(), key=lambda i: i.index.name)
        progress, unreachable = _overall(ds, [i for i in infos if i.state == IndexState.BUILDING])
    warn_unreachable(unreachable)
    if as_json:
        for info in infos:
            out = info_json(info)
            out["backfill"] = (
                progress.get(info.index.name)
                if info.state == IndexState.BUILDING
                else (1.0 if info.state == IndexState.READY else None)
            )
            click.echo(json_line(out))
        return
    if not infos:
        click.echo("no indexes: declare one with `schemaless index create`")
        return
    rows = []
    for info in infos:
        idx = info.index
        if info.state == IndexState.BUILDING:
            done = percent(progress.get(info.index.name))
        else:
            done = "100%" if info.state == IndexState.READY else "-"
        rows.append([idx.name, info.state, done, describe(idx), idx.shard_on, idx.multi or "-"])
    echo_table(["name", "state", "backfill", "properties", "shard on", "multi"], rows)


def _overall(ds: DataStore, building: list[IndexInfo]) -> tuple[dict[str, float | None], list[str]]:
    """Overall backfill fraction of each building index (the maxima read once), and
    the servers that did not answer."""
    if not building:
        return {}, []
    ranges = added_ranges(ds, ds.cluster.current())
    snaps = [backfill(ds, i.index.name, ranges) for i in building]
    return {s.index: s.fraction for s in snaps}, snaps[0].unreachable


@index.command()
@click.argument("name")
@click.option(
    "--watch",
    type=Finite(min=0.1),
    metavar="SECONDS",
    help="Show it again every SECONDS until the index is no longer building (rows/s "
    "and ETA measured between the views).",
)
@click.option("--all-shards", is_flag=True, help="List every shard, not only unfinished ones.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@pass_connection
def status(
    conn: Connection, name: str, watch: float | None, all_shards: bool, as_json: bool
) -> None:
    """Show an index: state, definition, backfill progress per shard, the Cleaner.

    Progress of a shard is the Cleaner's checkpoint (the last added_id it
    backfilled) over the shard's highest added_id.  Rows/s and ETA come from the
    Cleaner's heartbeat, or are measured with --watch; "unknown" when neither
    says.  The orphan backlog and last heartbeat are what the Cleaner reported.

    \b
    Example:
        schemaless index status by_user
        schemaless index status by_user --watch 5
    """
    with conn.store() as ds:
        first: Backfill | None = None
        while True:
            info = ds.cluster.refresh().indexes.get(name)
            if info is None:
                known = ", ".join(sorted(ds.indexes())) or "none"
                raise BadOption(f"no index named {name!r} (indexes: {known})", "NAME")
            snap = backfill(ds, name) if info.state == IndexState.BUILDING else None
            beats = heartbeats(ds)
            first = first or snap
            report = index_report(ds, info, snap, first, beats)
            if as_json:
                click.echo(json.dumps(report, sort_keys=True))
            else:
                if watch and first is not snap:
                    if sys.stdout.isatty():
                        click.clear()
                    else:
                        click.echo()
                echo_report(report, snap, all_shards)
            warn_unreachable(snap.unreachable if snap is not None else ())
            if not watch or info.state != IndexState.BUILDING:
                return
            time.sleep(watch)


@index.command()
@click.argument("name")
@click.option("--purge", is_flag=True, help="Also remove its tables and forget it.")
@pass_connection
def drop(conn: Connection, name: str, purge: bool) -> None:
    """Drop an index: writers stop maintaining it, queries refuse it.

    Writers stop at their next catalog refresh.  With --purge (now or later)
    the index tables are removed from every shard and the name can be declared
    again.

    \b
    Example:
        schemaless index drop by_link
        schemaless index drop by_link --purge
    """
    with conn.store() as ds:
        info = ds.indexes().get(name) or ds.cluster.refresh().indexes.get(name)
        if info is None:
            known = ", ".join(sorted(ds.indexes())) or "none"
            raise BadOption(f"no index named {name!r} (indexes: {known})", "NAME")
        if info.state != IndexState.DROPPED:
            ds.drop_index(name)
            click.echo(f"index {name} dropped: writers stop maintaining it at their next refresh")
            if not purge:
                click.echo(f"its tables stay until `schemaless index drop {name} --purge`")
        elif not purge:
            click.echo(f"index {name} was already dropped; --purge removes its tables")
        if purge:
            ds.purge_index(name)
            click.echo(f"index {name} purged: its tables are gone from every shard")
