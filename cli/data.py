"""Entities: ``get``, ``put``, ``delete`` and ``query``."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import click

from schemaless.catalog import IndexState
from schemaless.entity import Entity
from schemaless.errors import (
    InvalidCursor,
    InvalidId,
    SchemalessError,
    ShardUnavailable,
    TransientError,
)
from schemaless.ids import id_hex, parse_id
from schemaless.index import Index
from schemaless.query import MAX_LIMIT
from schemaless.store import DataStore

from .options import BadOption, CliError, Connection, Finite, needs_partial, pass_connection
from .output import (
    cell,
    decode_input,
    echo_table,
    entities_from_text,
    entity_to_json,
    json_line,
    warn_unreachable,
)
from .where import parse_where

__all__ = ["delete", "get", "put", "query"]

_PUT_BATCH = 500
#: 32 hex digits: how the CLI prints an id (16 bytes).
_HEX_ID = re.compile(r"[0-9a-fA-F]{32}")
where_option = partial(click.option, "--where", "wheres", multiple=True, metavar="EXPR")
json_option = click.option(
    "--json", "as_json", is_flag=True, help="JSON lines (one entity a line), for scripts."
)


def _ids(values: Sequence[str]) -> list[bytes]:
    out = []
    for text in values:
        try:
            out.append(parse_id(text))
        except InvalidId as exc:
            raise BadOption(str(exc), "ID") from None
    return out


def _echo_entity(entity: Entity) -> None:
    """A key/value listing: id and version first, then the properties."""
    pairs: list[tuple[str, str]] = [("id", id_hex(entity.id)), ("(version)", str(entity.version))]
    pairs += [(str(k), cell(v, 0)) for k, v in entity.items() if k != "id"]
    width = max(len(k) for k, _ in pairs)
    for key, text in pairs:
        click.echo(f"{key.ljust(width)}  {text}")


@click.command()
@click.argument("ids", metavar="ID...", nargs=-1, required=True)
@json_option
@pass_connection
def get(conn: Connection, ids: tuple[str, ...], as_json: bool) -> None:
    """Show entities by id (32 hex characters or the UUID form).

    Prints each entity's properties (bytes as hex) and its version; with --json,
    one JSON line per entity in the convention that `schemaless put` reads
    (docs/cli.md).  Exits 1 if an id is not found.

    \b
    Example:
        schemaless get 0190f3a4c2e47b3d8a1f5e6d7c8b9a01
        schemaless get 0190f3a4-c2e4-7b3d-8a1f-5e6d7c8b9a01 --json
    """
    keys = _ids(ids)
    with conn.store() as ds:
        found = ds.get_many(keys)
    missing = [id_hex(k) for k, e in zip(keys, found, strict=True) if e is None]
    first = True
    for entity in found:
        if entity is None:
            continue
        if as_json:
            click.echo(json_line(entity_to_json(entity)))
        else:
            if not first:
                click.echo()
            _echo_entity(entity)
        first = False
    if missing:
        raise CliError(f"not found: {', '.join(missing)}")


@click.command()
@click.option(
    "--file",
    "source",
    type=click.File("rb"),
    default="-",
    show_default=True,
    help="Read the entities from this file (UTF-8) instead of stdin.",
)
@click.option(
    "--ttl",
    type=Finite(min=0, min_open=True),
    metavar="SECONDS",
    help="Expire the entities this many seconds from now (see `schemaless expiry`).",
)
@json_option
@pass_connection
def put(conn: Connection, source: Any, ttl: float | None, as_json: bool) -> None:
    """Store entities read as JSON (UTF-8) from stdin.

    One JSON object, an array of them, or JSON lines.  Strings are text;
    {"$bytes": "<hex>"}, {"$uuid": "<uuid>"} and {"$datetime": "<ISO 8601>"}
    carry binary, UUID and datetime values; "id" may be 32 hex characters or a
    UUID string.  An entity without "id" gets a new one.
    Prints each entity's id (hex) and new version.  Last writer wins.  An error
    names the line (or array item) of the entity.

    \b
    Example:
        echo '{"id": "0190f3a4c2e47b3d8a1f5e6d7c8b9a01", "title": "hi"}' \\
            | schemaless put
        schemaless put --file entities.jsonl --json
        echo '{"user": "ada"}' | schemaless put --ttl 3600
    """
    name = str(getattr(source, "name", "-"))
    name = "stdin" if name in ("-", "<stdin>") else name
    if source.isatty():
        click.echo("reading JSON entities from stdin (end with Ctrl-D)", err=True)
    stored = 0
    with conn.store() as ds:  # opened first: a bad connection fails before one types
        text = _read(source, name)
        batch: list[tuple[str, dict[str, Any]]] = []
        try:
            for item in entities_from_text(text, name):
                batch.append(item)
                if len(batch) >= _PUT_BATCH:
                    _put_batch(ds, batch, ttl, as_json)
                    stored += len(batch)
                    batch = []
            if batch:
                _put_batch(ds, batch, ttl, as_json)
                stored += len(batch)
        except SchemalessError as exc:
            where = [f"{w}: " for w, e in batch if "id" in e and _names(exc, e["id"])]
            before = f" ({stored} entities were stored before this)" if stored else ""
            if isinstance(exc, TransientError) and len(batch) > 1:  # servers in parallel
                raise CliError(f"{exc}{before}; {_PARTLY}") from exc
            if where or stored:
                raise CliError(f"{''.join(where[:1])}{exc}{before}") from exc
            raise
    if not stored:
        raise CliError(f"no entities in {name} (expected a JSON object or JSON lines)")
    if not as_json:
        click.echo(f"stored {stored} entit{'y' if stored == 1 else 'ies'}", err=True)


def _read(source: Any, name: str) -> str:
    """The text of ``source`` (an unreadable file is an error naming it, not a traceback)."""
    try:
        data = source.read()
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror or exc}") from None
    return decode_input(data, name)


#: What a failed batch of puts may have stored (a statement per server, in parallel).
_PARTLY = (
    "the entities of this batch on the servers that answered may be stored: put them"
    ' again once it answers (last writer wins; an entity without "id" gets a new one)'
)


def _put_batch(
    ds: DataStore, batch: list[tuple[str, dict[str, Any]]], ttl: float | None, as_json: bool
) -> None:
    entities = [entity for _, entity in batch]
    if len(entities) > 1:
        versions = ds.put_many(entities, ttl=ttl)
    else:
        versions = [ds.put(entities[0], ttl=ttl)]
    for entity, version in zip(entities, versions, strict=True):
        key = id_hex(entity["id"])
        if as_json:
            click.echo(json_line({"id": key, "version": version}))
        else:
            click.echo(f"{key}  version {version}")


def _names(exc: Exception, entity_id: Any) -> bool:
    """Whether the error is about this entity (its message names the id)."""
    try:
        return id_hex(entity_id) in str(exc)
    except InvalidId:
        return False


@click.command()
@click.argument("ids", metavar="ID...", nargs=-1, required=True)
@pass_connection
def delete(conn: Connection, ids: tuple[str, ...]) -> None:
    """Delete entities by id.

    Exits 1 if one of them did not exist.

    \b
    Example:
        schemaless delete 0190f3a4c2e47b3d8a1f5e6d7c8b9a01
    """
    keys = _ids(ids)
    missing = []
    with conn.store() as ds:
        for key in keys:
            if ds.delete(key):
                click.echo(f"deleted {id_hex(key)}")
            else:
                missing.append(id_hex(key))
    if missing:
        raise CliError(f"not found: {', '.join(missing)}")


def _check_order(index: Index, order: str) -> str:
    if order in ("asc", "desc") or order.lstrip("+-") in index.properties:
        return order
    raise BadOption(
        f"{order!r}: use asc, desc, PROPERTY or -PROPERTY "
        f"(properties of {index.name!r}: {', '.join(index.properties)})",
        "--order",
    )


def _columns(index: Index, entities: Iterable[Mapping[str, Any]], chosen: str | None) -> list[str]:
    """The table's columns: those chosen (each one id, a property of the index or of an
    entity shown), else id, the index's properties, then the rest."""
    cols = ["id", *index.properties]
    for entity in entities:
        for key in entity:
            if key not in cols:
                cols.append(str(key))
    if not chosen:
        return cols
    picked = [c.strip() for c in chosen.split(",") if c.strip()]
    unknown = [c for c in picked if c not in cols]
    if unknown or not picked:
        raise BadOption(
            f"no column {', '.join(map(repr, unknown)) or repr(chosen)} "
            f"(columns: {', '.join(cols)})",
            "--columns",
        )
    return picked


@click.command()
@click.argument("index_name", metavar="INDEX")
@where_option(
    help="PROPERTY OP VALUE, OP one of = > >= < <= (repeatable), or "
    "PROPERTY__startswith=VALUE: equality on a prefix of the index's properties, then "
    "at most one range or prefix on the next."
)
@click.option(
    "--order",
    default="asc",
    show_default=True,
    help="asc, desc, or [-]PROPERTY (the property after the equality prefix).",
)
@click.option(
    "--limit", type=click.IntRange(1, MAX_LIMIT), default=20, show_default=True, help="Page size."
)
@click.option("--cursor", help="Continue after the page that printed this cursor.")
@click.option("--all", "everything", is_flag=True, help="Every match, page after page.")
@click.option(
    "--columns", metavar="A,B,...", help="Table columns (default: id, the index's, the rest)."
)
@click.option(
    "--include-building", is_flag=True, help="Also query an index that is still building."
)
@click.option(
    "--partial",
    is_flag=True,
    help="With a server down, the page of the servers that answer (the others named on "
    "stderr) instead of an error.",
)
@json_option
@pass_connection
def query(
    conn: Connection,
    index_name: str,
    wheres: tuple[str, ...],
    order: str,
    limit: int,
    cursor: str | None,
    everything: bool,
    columns: str | None,
    include_building: bool,
    partial: bool,
    as_json: bool,
) -> None:
    """Query an index: one page of matching entities, in index order.

    Values in --where are converted by the index column's type (int, float,
    bool, str, uuid as hex or UUID form, bytes as hex; an untyped column takes an
    integer, else a float, else text; "quotes" force text; a cast such as
    uuid:<hex> forces a type).  Prints a table, or JSON lines with --json, then the
    cursor of the next page (on stderr with --json).

    \b
    Example:
        schemaless query by_user --where user_id=0190f3a4c2e47b3d8a1f5e6d7c8b9a01 \\
            --where 'published>=1700000000' --order -published --limit 20
        schemaless query by_link --where link=https://example.com/a --json
        schemaless query by_name --where 'name__startswith=ali' --limit 10
    """
    with conn.store() as ds:
        index = _queryable(ds, index_name, include_building)
        conditions = parse_where(wheres, index)
        order = _check_order(index, order)
        if cursor is not None and everything:
            raise BadOption("--cursor and --all do not go together", "--cursor")
        if partial and everything:
            raise BadOption("--partial reads a page at a time: not with --all", "--partial")
        if everything:
            found = ds.iter(
                index_name,
                order=order,
                page_size=limit,
                include_building=include_building,
                where=conditions,  # a property may be named like a parameter (order...)
            )
            if as_json:
                for entity in found:
                    click.echo(json_line(entity_to_json(entity)))
                return
            page: list[Entity] = list(found)
            next_cursor = None
        else:
            flags = (include_building, partial)
            page, next_cursor = _one_page(ds, index_name, conditions, order, limit, cursor, flags)
    if not page:
        _hint_untyped(index, conditions)
    _echo_page(index, page, next_cursor, columns, as_json)


def _hint_untyped(index: Index, conditions: Mapping[str, Any]) -> None:
    """After an empty page: an untyped (auto) column compared with 32 hex digits took
    them as text, which never equals an id stored as bytes; say how to ask for bytes."""
    for key, value in conditions.items():
        prop = key.split("__")[0]
        if prop not in index.properties:
            continue
        auto = index.types[index.properties.index(prop)].name == "auto"
        if auto and isinstance(value, str) and _HEX_ID.fullmatch(value):
            click.echo(
                f"note: {prop} is untyped (auto), so {value} was compared as text; an id"
                f" stored as bytes is --where {prop}=bytes:{value}",
                err=True,
            )


def _one_page(
    ds: DataStore,
    index_name: str,
    conditions: dict[str, Any],
    order: str,
    limit: int,
    cursor: str | None,
    flags: tuple[bool, bool],
) -> tuple[list[Entity], str | None]:
    """One page of ``query`` (``flags``: include building, partial; the shards a
    partial page left out named on stderr), and the next page's cursor."""
    include_building, partial = flags
    try:
        result = ds.query(
            index_name,
            order=order,
            limit=limit,
            cursor=cursor,
            include_building=include_building,
            partial=partial,
            where=conditions,
        )
    except InvalidCursor as exc:
        raise BadOption(f"{exc}: use the cursor a page of this query printed", "--cursor") from None
    except ShardUnavailable as exc:
        if partial:
            raise
        raise needs_partial(exc) from exc
    _warn_missing(ds, result.missing_shards)
    return list(result), result.cursor


def _warn_missing(ds: DataStore, shards: tuple[int, ...]) -> None:
    """Name on stderr the logical shards a partial page left out, and their servers."""
    if shards:
        left = f"logical shards {', '.join(map(str, shards))}: their entities are not in this page"
        warn_unreachable(ds.cluster.current().addresses_of(shards), left)


@click.command()
@click.argument("index_name", metavar="INDEX")
@where_option(
    help="As in `query`. Exact counts take equality on a prefix of a counted index's "
    "properties (none: every entity it holds)."
)
@click.option(
    "--exact/--no-exact",
    default=True,
    show_default=True,
    help="--no-exact: count the matching index rows of any index, with any `query` "
    "condition (an upper bound: an entity with several rows, and rows a crash or the "
    "background step left, count until the Cleaner removes them).",
)
@json_option
@pass_connection
def count(
    conn: Connection, index_name: str, wheres: tuple[str, ...], exact: bool, as_json: bool
) -> None:
    """Count the entities that match, without reading them.

    Exact counts come from the counters a counted index keeps (`index create
    --counted`), one statement per server; --no-exact counts index rows.

    \b
    Example:
        schemaless count likes_by_entry --where entry_id=0190f3a4c2e47b3d8a1f5e6d7c8b9a01
        schemaless count posts
        schemaless count by_user --where user_id=42 --where 'published>=1700000000' --no-exact
    """
    with conn.store() as ds:
        index = _queryable(ds, index_name, False)
        n = ds.count(index_name, exact=exact, where=parse_where(wheres, index))
    if as_json:
        click.echo(json_line({"index": index_name, "count": n, "exact": exact}))
        return
    click.echo(str(n))


def _queryable(ds: DataStore, index_name: str, include_building: bool) -> Index:
    """The index a query may read, or the error that says why not."""
    info = ds.indexes().get(index_name)
    if info is None:
        known = ", ".join(sorted(ds.indexes())) or "none"
        raise BadOption(f"no index named {index_name!r} (indexes: {known})", "INDEX")
    if info.state == IndexState.DROPPED or (
        info.state == IndexState.BUILDING and not include_building
    ):
        raise CliError(
            f"index {index_name!r} is dropped"
            if info.state == IndexState.DROPPED
            else f"index {index_name!r} is building: backfill it with `cleaner "
            f"--index={index_name}` (--include-building shows what it holds so far)"
        )
    return info.index


def _cell(index: Index, entity: Entity, column: str) -> str:
    """A table cell: the id as hex, a property of the index followed down its path
    (``author.id``; a ``multi`` one's values as a list), else the entity's property."""
    if column == "id":
        return id_hex(entity.id)
    if column in index.properties:
        return cell(index.lookup(entity, index.properties.index(column)))
    return cell(entity.get(column))


def _echo_page(
    index: Index, page: list[Entity], next_cursor: str | None, columns: str | None, as_json: bool
) -> None:
    """A page as JSON lines (the cursor on stderr) or as a table."""
    if as_json:
        for entity in page:
            click.echo(json_line(entity_to_json(entity)))
        if next_cursor:
            click.echo(f"next cursor: {next_cursor}", err=True)
        return
    if not page:
        click.echo("no matching entities")
        return
    cols = _columns(index, page, columns)
    rows = [[_cell(index, e, c) for c in cols] for e in page]
    echo_table(cols, rows)
    more = f"; next page: --cursor {next_cursor}" if next_cursor else ""
    click.echo(f"({len(page)} entit{'y' if len(page) == 1 else 'ies'}{more})")
