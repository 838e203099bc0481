"""``schemaless init``, and the listing of ``schemaless shards``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click

from schemaless.catalog import Topology
from schemaless.cluster import DEFAULT_SHARDS
from schemaless.dsn import parse_address
from schemaless.errors import CatalogError
from schemaless.feed import enable_changes
from schemaless.owned import LAYOUTS, OWNED
from schemaless.store import DataStore

from .expiry import expiry_property
from .options import BadOption, CliError, Connection, pass_connection
from .output import echo_table, human_bytes, json_line, warn_unreachable
from .stats import ServerFigures, server_figures

__all__ = ["init", "show_shards"]


def _check_servers(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    for spec in values:
        try:
            parse_address(spec)
        except CatalogError as exc:
            raise BadOption(str(exc), "--server") from None
    if len(set(values)) != len(values):
        raise BadOption("a server is listed twice", "--server")
    return values


def _summary(ds: DataStore) -> str:
    topo = ds.cluster.current()
    return (
        f"{topo.n_shards} logical shards on {len(topo.servers)} "
        f"server{'s' if len(topo.servers) != 1 else ''} (layout {topo.layout}), "
        f"catalog {topo.prefix}_catalog on {ds.cluster.catalog.server.name}"
        + (f", entities expire at the time in {topo.expire_on!r}" if topo.expire_on else "")
    )


@click.command()
@click.option(
    "--server",
    "servers",
    multiple=True,
    metavar="HOST:PORT",
    callback=_check_servers,
    help="A server of the new datastore (repeatable; the first holds the catalog). "
    "Default: --url, else the local cluster's servers.",
)
@click.option(
    "--shards",
    type=click.IntRange(1, 65536),
    help=f"Number of logical shards, fixed for the datastore's life [default: {DEFAULT_SHARDS}].",
)
@click.option(
    "--expire-on",
    metavar="PROPERTY",
    callback=expiry_property,
    help="The property holding each entity's expiry time (epoch seconds); see `schemaless expiry`.",
)
@click.option(
    "--changes",
    is_flag=True,
    help="Turn the change feed on (`schemaless changes`); also for an existing datastore.",
)
@click.option(
    "--layout",
    type=click.Choice(LAYOUTS),
    help="How a new datastore stores its logical shards: owned (one table per server, "
    "the shard a column) or databases (a database per logical shard, as before 0.13) "
    f"[default: {OWNED}].",
)
@pass_connection
def init(
    conn: Connection,
    servers: tuple[str, ...],
    shards: int | None,
    expire_on: str | None,
    changes: bool,
    layout: str | None,
) -> None:
    """Create the catalog and the logical shards.

    The logical shards are spread round-robin over the servers; in the owned
    layout (the default) each server has one database with a table for all of
    its shards, in the databases layout each shard is a database.  Running it
    again is harmless; it refuses to change the number of shards or the layout
    of an existing datastore (move one to the owned layout with `schemaless
    dump` and `schemaless restore`: docs/operations.md).

    \b
    Example:
        schemaless init --shards 16
        schemaless init --server db1:3306 --server db2:3306 --shards 1024
        schemaless init --shards 16 --expire-on expires_at
        schemaless init --shards 16 --changes
        schemaless init --shards 16 --layout databases
    """
    kwargs: dict[str, Any] = {} if shards is None else {"shards": shards}
    if expire_on is not None:
        kwargs["expire_on"] = expire_on
    created = False
    try:
        with conn.store(servers=servers, create=False, **kwargs) as ds:
            summary = _summary(ds)
            _same_layout(ds, layout)
    except CatalogError:
        # No datastore yet (any other problem is raised again by the attempt below).
        with conn.store(servers=servers, create=True, layout=layout or OWNED, **kwargs) as ds:
            summary = _summary(ds)
        created = True
    turned_on = False
    if changes:
        with conn.store(servers=servers) as ds:
            turned_on = not ds.cluster.current().changes
            enable_changes(ds.cluster)
    if created:
        feed = "; change feed on" if changes else ""
        click.echo(f"created datastore {conn.prefix!r}: {summary}{feed}")
    elif turned_on:
        click.echo(f"datastore {conn.prefix!r} already exists: {summary}; change feed turned on")
    else:
        feed = "; change feed on" if changes else ""
        click.echo(f"datastore {conn.prefix!r} already exists: {summary}{feed}; nothing changed")
    if servers and not conn.url:
        first, _ = parse_address(servers[0])
        click.echo(f"connect with: export SCHEMALESS_URL={first}  (credentials not shown)")


def _same_layout(ds: DataStore, layout: str | None) -> None:
    """Refuse a --layout other than the existing datastore's (no conversion in place)."""
    found = ds.cluster.current().layout
    if layout is not None and layout != found:
        raise CliError(
            f"datastore {ds.cluster.current().prefix!r} exists in the {found} layout, not "
            f"{layout}: a layout is changed by dump and restore into a new datastore "
            "(`schemaless dump DIR`, `schemaless init --prefix NEW`, `schemaless restore DIR "
            "--prefix NEW`)"
        )


def show_shards(conn: Connection, per_shard: bool, estimate: bool, as_json: bool) -> None:
    """Print servers, logical shards, entity counts and sizes."""
    with conn.store() as ds:
        topo = ds.cluster.current()
        figures = server_figures(ds, estimate=estimate)
    warn_unreachable(f.address for f in figures if f.live is None)
    for hint in topo.move_hints():
        click.echo(f"warning: {hint}", err=True)
    if as_json:
        for f in figures:
            click.echo(json_line(_server_json(f, topo, per_shard)))
        return
    click.echo(
        f"datastore {topo.prefix!r}: {topo.n_shards} logical shards on "
        f"{len(topo.servers)} servers (map version {topo.map_version}, {_layout(topo)})"
    )
    live_head = "rows (estimate)" if estimate else "live"
    if per_shard:
        _echo_shards(topo, figures, live_head, estimate)
    else:
        _echo_servers(topo, figures, live_head, estimate)
    for f in figures:
        if f.catalog_size is not None:
            click.echo(
                f"catalog {topo.prefix}_catalog on {f.address}: {human_bytes(f.catalog_size)}"
            )


def _echo_shards(
    topo: Topology, figures: list[ServerFigures], live_head: str, estimate: bool
) -> None:
    """One row a logical shard."""
    rows = []
    for f in figures:
        for s in f.shards:
            rows.append(
                [
                    str(s),
                    topo.dbs[s],
                    f.address,
                    "-" if f.rows is not None else _n(f.live, s),
                    "-" if estimate else _n(f.tombstones, s),
                    _shard_size(topo, f, s),
                ]
            )
    echo_table(
        ["shard", "database", "server", live_head, "tombstones", "size"],
        rows,
        right=["shard", live_head, "tombstones", "size"],
    )


def _echo_servers(
    topo: Topology, figures: list[ServerFigures], live_head: str, estimate: bool
) -> None:
    """One row a server, and the totals."""
    rows = []
    for f in figures:
        rows.append(
            [
                str(f.server_id),
                f.address,
                str(len(f.shards)),
                _count(f.live_total),
                "-" if estimate else _count(_added(f.tombstones)),
                human_bytes(f.size),
            ]
        )
    if len(figures) > 1:
        rows.append(
            [
                "total",
                "",
                str(topo.n_shards),
                _count(_total_of(f.live_total for f in figures)),
                "-" if estimate else _count(_total_of(_added(f.tombstones) for f in figures)),
                human_bytes(_total_of(f.size for f in figures)),
            ]
        )
    echo_table(
        ["server", "address", "shards", live_head, "tombstones", "size"],
        rows,
        right=["shards", live_head, "tombstones", "size"],
    )


def _n(values: dict[int, int] | None, shard: int) -> str:
    if values is None or shard not in values:
        return "unknown"
    return f"{values[shard]:,}"


def _count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def _added(values: dict[int, int] | None) -> int | None:
    return None if values is None else sum(values.values())


def _total_of(values: Iterable[int | None]) -> int | None:
    found = list(values)
    return None if any(v is None for v in found) else sum(v or 0 for v in found)


def _layout(topo: Topology) -> str:
    if topo.owned_db is not None:
        return f"layout owned: one database {topo.owned_db} per server"
    return "layout databases: a database per logical shard"


def _shard_size(topo: Topology, f: ServerFigures, shard: int) -> str:
    if topo.owned_db is not None:
        return "-"  # one table per server: no size per shard
    return human_bytes(f.sizes.get(shard) if f.sizes else None)


def _server_json(f: ServerFigures, topo: Topology, per_shard: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "server_id": f.server_id,
        "address": f.address,
        "layout": topo.layout,
        "shards": f.shards,
        "live": f.live_total,
        "tombstones": None if f.tombstones is None or f.estimated else sum(f.tombstones.values()),
        "estimated": f.estimated,
        "size_bytes": f.size,
        "catalog_size_bytes": f.catalog_size,
    }
    if per_shard:
        out["per_shard"] = [
            {
                "shard": s,
                "database": topo.dbs[s],
                "live": None if f.live is None else f.live.get(s),
                "tombstones": None if f.tombstones is None or f.estimated else f.tombstones.get(s),
                "size_bytes": None if f.sizes is None else f.sizes.get(s),
            }
            for s in f.shards
        ]
    return out
