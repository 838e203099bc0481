"""``schemaless init``, and the listing of ``schemaless shards``."""

from __future__ import annotations

from typing import Any

import click

from schemaless.catalog import Topology
from schemaless.cluster import DEFAULT_SHARDS
from schemaless.dsn import parse_address
from schemaless.errors import CatalogError
from schemaless.feed import enable_changes
from schemaless.store import DataStore

from .expiry import expiry_property
from .options import BadOption, Connection, pass_connection
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
        f"server{'s' if len(topo.servers) != 1 else ''}, "
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
@pass_connection
def init(
    conn: Connection,
    servers: tuple[str, ...],
    shards: int | None,
    expire_on: str | None,
    changes: bool,
) -> None:
    """Create the catalog and the logical shards.

    Each logical shard is a database; they are spread round-robin over the
    servers.  Running it again is harmless; it refuses to change the number of
    shards of an existing datastore.

    \b
    Example:
        schemaless init --shards 16
        schemaless init --server db1:3306 --server db2:3306 --shards 1024
        schemaless init --shards 16 --expire-on expires_at
        schemaless init --shards 16 --changes
    """
    kwargs: dict[str, Any] = {} if shards is None else {"shards": shards}
    if expire_on is not None:
        kwargs["expire_on"] = expire_on
    created = False
    try:
        with conn.store(servers=servers, create=False, **kwargs) as ds:
            summary = _summary(ds)
    except CatalogError:
        # No datastore yet (any other problem is raised again by the attempt below).
        with conn.store(servers=servers, create=True, **kwargs) as ds:
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


def show_shards(conn: Connection, per_shard: bool, estimate: bool, as_json: bool) -> None:
    """Print servers, logical shards, entity counts and sizes."""
    with conn.store() as ds:
        topo = ds.cluster.current()
        figures = server_figures(ds, estimate=estimate)
    warn_unreachable(f.address for f in figures if f.live is None)
    if as_json:
        for f in figures:
            click.echo(json_line(_server_json(f, topo, per_shard)))
        return
    click.echo(
        f"datastore {topo.prefix!r}: {topo.n_shards} logical shards on "
        f"{len(topo.servers)} servers (map version {topo.map_version})"
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
                    _n(f.live, s),
                    "-" if estimate else _n(f.tombstones, s),
                    human_bytes(f.sizes.get(s) if f.sizes else None),
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
                _total(f.live),
                "-" if estimate else _total(f.tombstones),
                human_bytes(sum(f.sizes.values()) if f.sizes is not None else None),
            ]
        )
    if len(figures) > 1:
        rows.append(
            [
                "total",
                "",
                str(topo.n_shards),
                _sum(f.live for f in figures),
                "-" if estimate else _sum(f.tombstones for f in figures),
                human_bytes(_sizes_total(figures)),
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


def _total(values: dict[int, int] | None) -> str:
    return "unknown" if values is None else f"{sum(values.values()):,}"


def _sum(parts: Any) -> str:
    values = list(parts)
    if any(v is None for v in values):
        return "unknown"
    return f"{sum(sum(v.values()) for v in values):,}"


def _sizes_total(figures: list[ServerFigures]) -> int | None:
    if any(f.sizes is None for f in figures):
        return None
    return sum(sum(f.sizes.values()) for f in figures if f.sizes is not None)


def _server_json(f: ServerFigures, topo: Topology, per_shard: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "server_id": f.server_id,
        "address": f.address,
        "shards": f.shards,
        "live": None if f.live is None else sum(f.live.values()),
        "tombstones": None if f.tombstones is None or f.estimated else sum(f.tombstones.values()),
        "estimated": f.estimated,
        "size_bytes": None if f.sizes is None else sum(f.sizes.values()),
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
