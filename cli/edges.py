"""``schemaless edges``: an edge type's tables, counts and pages, and its repair."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from schemaless.edges import Edges, missing_tables
from schemaless.edgetables import table_names
from schemaless.errors import InvalidCursor, InvalidId, SchemalessError
from schemaless.ids import id_hex, parse_id
from schemaless.query import MAX_LIMIT

from .options import BadOption, Connection, Finite, group_connection, pass_connection
from .output import cell, echo_table, json_line

__all__ = ["edges"]


def _id(ctx: click.Context, param: click.Parameter, value: str) -> bytes:
    try:
        return parse_id(value)
    except InvalidId as exc:
        raise BadOption(str(exc), "ID") from None


@click.group()
@group_connection
def edges() -> None:
    """Edge types (schemaless.edges): create, counts, pages, repair.

    \b
    Example:
        schemaless edges create likes --inverse liked_by
        schemaless edges count likes 0190f3a4c2e47b3d8a1f5e6d7c8b9a01
        schemaless edges page liked_by 0190f3a4c2e47b3d8a1f5e6d7c8b9a01 --limit 50
        schemaless edges repair follows --inverse followers
    """


@edges.command()
@click.argument("kind", metavar="TYPE")
@click.option("--inverse", metavar="TYPE", help="The inverse edge type, if any.")
@pass_connection
def create(conn: Connection, kind: str, inverse: str | None) -> None:
    """Create the tables of edge type TYPE (and of its inverse) on every server: an
    admin's step before the application's user, which has no DDL, uses the type.

    \b
    Example:
        schemaless edges create likes --inverse liked_by
    """
    with conn.store() as ds:
        try:
            Edges(ds, kind, inverse=inverse, create=False).create()
            servers = len(ds.cluster.current().servers)
        except SchemalessError as exc:
            raise click.ClickException(str(exc)) from None
    names = kind if inverse is None else f"{kind}/{inverse}"
    click.echo(f"edge type {names}: tables on {servers} servers")


@edges.command()
@click.argument("kind", metavar="TYPE")
@click.argument("node", metavar="ID", callback=_id)
@pass_connection
def count(conn: Connection, kind: str, node: bytes) -> None:
    """How many edges of TYPE leave the entity ID (an inverse type: reach it).

    \b
    Example:
        schemaless edges count likes 0190f3a4c2e47b3d8a1f5e6d7c8b9a01
    """
    with conn.store() as ds:
        try:
            click.echo(Edges(ds, kind, create=False).count(node))
        except SchemalessError as exc:
            raise click.ClickException(str(exc)) from None


@edges.command()
@click.argument("kind", metavar="TYPE")
@click.argument("node", metavar="ID", callback=_id)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIMIT),
    default=20,
    show_default=True,
    help="Edges on the page.",
)
@click.option("--cursor", help="The cursor printed after the previous page.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines (dst, at, data).")
@pass_connection
def page(
    conn: Connection, kind: str, node: bytes, limit: int, cursor: str | None, as_json: bool
) -> None:
    """The edges of TYPE leaving the entity ID, newest first.

    \b
    Example:
        schemaless edges page liked_by 0190f3a4c2e47b3d8a1f5e6d7c8b9a01 --limit 50
    """
    with conn.store() as ds:
        try:
            got = Edges(ds, kind, create=False).page(node, limit, cursor)
        except InvalidCursor as exc:
            hint = "use the cursor the previous page printed"
            raise BadOption(f"{exc}: {hint}", "--cursor") from None
        except SchemalessError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        for e in got:
            click.echo(json_line({"dst": id_hex(e.dst), "at": e.at, "data": e.data}))
    else:
        rows = [[id_hex(e.dst), _when(e.at), cell(e.data)] for e in got]
        echo_table(["dst", "at (UTC)", "data"], rows)
    if got.cursor:
        click.echo(f"next page: --cursor {got.cursor}", err=True)


def _when(at_us: int) -> str:
    """An edge's time (µs since the epoch) as UTC, to the microsecond."""
    return datetime.fromtimestamp(at_us / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


@edges.command()
@click.argument("kind", metavar="TYPE")
@click.option("--inverse", required=True, metavar="TYPE", help="The inverse edge type.")
@click.option(
    "--grace",
    default=60.0,
    show_default=True,
    type=Finite(min=0),
    help="Seconds an orphan is left.",
)
@pass_connection
def repair(conn: Connection, kind: str, inverse: str, grace: float) -> None:
    """Remove inverse edges whose forward edge is missing (a call cut between them).

    \b
    Example:
        schemaless edges repair follows --inverse followers
    """
    with conn.store() as ds:
        try:
            n = _known(Edges(ds, kind, inverse=inverse, create=False)).repair(grace)
        except SchemalessError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"{kind}/{inverse}: {n} orphaned inverse edges removed")


def _known(edges: Edges) -> Edges:
    """``edges`` if its tables exist (a mistyped type is named, not a missing table)."""
    if missing_tables(edges.ds, [t for k in edges.kinds() for t in table_names(k)]):
        raise click.ClickException(
            f"unknown edge type {'/'.join(edges.kinds())!r}: its tables do not exist"
            f" (`{edges.command()}` creates them)"
        )
    return edges
