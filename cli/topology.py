"""``schemaless shards``, ``servers``, ``replicas`` and ``dictionary``: the cluster map."""

from __future__ import annotations

import re
from typing import Any

import click

from schemaless.catalog import Topology
from schemaless.dsn import Address, parse_address
from schemaless.errors import CatalogError
from schemaless.move import MoveReport, ShardMover, rebalance_plan

from .admin import show_shards
from .options import BadOption, Connection, Finite, group_connection, pass_connection

__all__ = ["dictionary", "replicas", "servers", "shards"]


def _address(ctx: click.Context, param: click.Parameter, value: str) -> Address:
    try:
        address, creds = parse_address(value)
    except CatalogError as exc:
        raise BadOption(str(exc), param.human_readable_name) from None
    if creds.password is not None:
        raise BadOption("give credentials through the environment, not here", "HOST:PORT")
    return address


def _server_id(topo: Topology, spec: str, param: str = "--to") -> int:
    if spec.isdigit() and int(spec) in topo.servers:
        return int(spec)
    for sid, address in topo.servers.items():
        if str(address) == spec:
            return sid
    known = ", ".join(f"{sid} ({a})" for sid, a in sorted(topo.servers.items()))
    raise BadOption(f"unknown server {spec!r}; known: {known}", param)


class _ShardCommand(click.Command):
    """A command taking a logical shard's number: a negative one (``move -1``), which
    click takes for an unknown option (a usage error, exit 2), is a bad SHARD (exit 1)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> Any:
        given = list(args)  # click's parser consumes ``args``
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption:
            negative = next((a for a in given if re.fullmatch(r"-[0-9]+", a)), None)
            if negative is None:
                raise
            message = f"no logical shard {negative}: they are numbered from 0"
            raise BadOption(message, "SHARD") from None


def _check_shard(topo: Topology, shard: int) -> None:
    """A SHARD past the last is a bad SHARD, as a negative one is."""
    if shard >= topo.n_shards:
        message = f"no logical shard {shard}: there are {topo.n_shards} (0 to {topo.n_shards - 1})"
        raise BadOption(message, "SHARD")


def _report(report: MoveReport) -> None:
    if report.dry_run or report.source == report.target:  # the mover said so
        return
    tables = ", ".join(f"{t} {n:,} rows" for t, (n, _) in sorted(report.verified.items()))
    click.echo(
        f"shard {report.shard}: {report.source} -> {report.target}; "
        f"{report.rows_copied:,} rows copied, {report.rows_deleted:,} removed; "
        f"writes paused {report.pause_seconds * 1000:.0f} ms; verified: {tables or 'nothing'}"
    )


@click.group(invoke_without_command=True)
@click.option("--per-shard", is_flag=True, help="One line per logical shard.")
@click.option(
    "--estimate",
    is_flag=True,
    help="InnoDB's row estimates instead of counting (fast on big tables; no "
    "split between live entities and tombstones; the owned layout counts).",
)
@click.option("--json", "as_json", is_flag=True, help="JSON lines, for scripts.")
@pass_connection
def shards(conn: Connection, per_shard: bool, estimate: bool, as_json: bool) -> None:
    """Show servers, logical shards, entity counts and sizes; move shards.

    Counts are exact (a scan of every entities table; --estimate for InnoDB's
    estimate).  Sizes are data + index lengths as information_schema reports
    them.  Tombstones are deleted entities kept until the Cleaner purges them.

    \b
    Example:
        schemaless shards
        schemaless shards --per-shard --json
        schemaless shards move 5 --to 127.0.0.1:3308
    """
    ctx = click.get_current_context()
    if ctx.invoked_subcommand is None:
        show_shards(conn, per_shard, estimate, as_json)


@shards.command(cls=_ShardCommand)
@click.argument("shard", type=click.IntRange(min=0))
@click.option("--to", "target", required=True, metavar="SERVER", help="Server id or host:port.")
@click.option("--dry-run", is_flag=True, help="Show what would move; change nothing.")
@click.option(
    "--chunk",
    type=click.IntRange(1, 100000),
    default=2000,
    show_default=True,
    help="Rows per copy statement.",
)
@pass_connection
def move(conn: Connection, shard: int, target: str, dry_run: bool, chunk: int) -> None:
    """Move one logical shard to another server, online.

    Copies the shard, fences the old copy for a short cut-over (writers wait and
    retry), verifies row counts and checksums, and flips the map.  The old copy is
    kept until `schemaless shards drop-old`.  Safe to run again if interrupted, or
    to roll back (`schemaless shards rollback`).

    \b
    Example:
        schemaless shards move 5 --to 1
        schemaless shards move 5 --to 127.0.0.1:3308 --dry-run
    """
    with conn.store() as ds:
        topo = ds.cluster.refresh()
        _check_shard(topo, shard)
        sid = _server_id(topo, target)
        mover = ShardMover(ds, chunk=chunk, progress=click.echo)
        _report(mover.move(shard, sid, dry_run=dry_run))


@shards.command()
@click.option("--dry-run", is_flag=True, help="Show the plan; move nothing.")
@pass_connection
def rebalance(conn: Connection, dry_run: bool) -> None:
    """Even out the number of logical shards per server by moving shards.

    \b
    Example:
        schemaless servers add 127.0.0.1:3308
        schemaless shards rebalance --dry-run
        schemaless shards rebalance
    """
    with conn.store() as ds:
        topo = ds.cluster.refresh()
        plan = rebalance_plan(topo)
        if not plan:
            click.echo("balanced: nothing to move")
            return
        for shard, source, target in plan:
            click.echo(f"shard {shard}: {topo.servers[source]} -> {topo.servers[target]}")
        if dry_run:
            click.echo(f"{len(plan)} moves planned (dry run)")
            return
        mover = ShardMover(ds, progress=click.echo)
        for shard, _, target in plan:
            _report(mover.move(shard, target))


@shards.command(cls=_ShardCommand)
@click.argument("shard", type=click.IntRange(min=0))
@pass_connection
def rollback(conn: Connection, shard: int) -> None:
    """Undo an unfinished move of a shard (the old copy becomes live again).

    \b
    Example:
        schemaless shards rollback 5
    """
    with conn.store() as ds:
        topo = ds.cluster.refresh()
        _check_shard(topo, shard)
        record = topo.moves.get(shard)
        ShardMover(ds).rollback(shard)
    if record is None:
        click.echo(f"shard {shard}: no move in progress")
        return
    source, target = (topo.servers[sid] for sid in record[:2])
    click.echo(f"shard {shard}: move to {target} rolled back; on {source} again")


@shards.command("drop-old")
@click.option(
    "--chunk",
    type=click.IntRange(1, 100000),
    default=2000,
    show_default=True,
    help="Rows per delete (owned layout).",
)
@click.option(
    "--pause",
    type=Finite(0, 60),
    default=0.05,
    show_default=True,
    help="Seconds between two deletes (owned layout).",
)
@pass_connection
def drop_old(conn: Connection, chunk: int, pause: float) -> None:
    """Delete the old copies that finished moves left behind.

    In the owned layout: each server's rows of the logical shards it does not hold
    (no move in progress), in chunks with a pause between them; otherwise the side
    databases of the moves.

    \b
    Example:
        schemaless shards drop-old
        schemaless shards drop-old --chunk 500 --pause 0.2
    """
    with conn.store() as ds:
        dropped = ShardMover(ds, chunk=chunk, pause=pause).drop_old_copies()
    click.echo("\n".join(f"dropped {d}" for d in dropped) or "no old copies")


@click.group()
@group_connection
def servers() -> None:
    """The servers of the datastore.

    \b
    Example:
        schemaless servers list
        schemaless servers add 127.0.0.1:3308
    """


@servers.command("list")
@pass_connection
def list_servers(conn: Connection) -> None:
    """Servers with their logical shards and replicas.

    \b
    Example:
        schemaless servers list
    """
    with conn.store() as ds:
        topo = ds.cluster.refresh()
    for sid, address in sorted(topo.servers.items()):
        replicas = ", ".join(str(a) for a in topo.replicas.get(sid, ())) or "none"
        click.echo(
            f"{sid}  {address}  {len(topo.shards_of(sid))} logical shards  replicas: {replicas}"
        )


@servers.command("add")
@click.argument("address", metavar="HOST:PORT", callback=_address)
@pass_connection
def add_server(conn: Connection, address: Address) -> None:
    """Add an empty server; shards reach it by moves (`shards rebalance`).

    \b
    Example:
        schemaless servers add 127.0.0.1:3308
    """
    with conn.store() as ds:
        ds.cluster.server(address).run("SELECT 1")  # reachable with our credentials
        ShardMover(ds).prepare_server(address)  # owned layout: its tables, before it is named
        sid = ds.cluster.catalog.add_server(address)
    click.echo(f"server {sid} = {address}: added; next: schemaless shards rebalance")


@click.group()
@group_connection
def replicas() -> None:
    """Read replicas of the servers (reads with consistency='replica').

    \b
    Example:
        schemaless replicas add 0 127.0.0.1:3310
    """


@replicas.command("add")
@click.argument("server", metavar="SERVER")
@click.argument("address", metavar="HOST:PORT", callback=_address)
@pass_connection
def add_replica(conn: Connection, server: str, address: Address) -> None:
    """Register a replica of SERVER (id or host:port); replication is yours to set up.

    \b
    Example:
        schemaless replicas add 0 127.0.0.1:3310
    """
    with conn.store() as ds:
        sid = _server_id(ds.cluster.refresh(), server, "SERVER")
        lag = ds.cluster.server(address).replica_lag()
        ds.cluster.catalog.add_replica(sid, address)
    state = "not replicating yet" if lag is None else f"{lag:g} s behind"
    click.echo(f"replica {address} of server {sid}: registered ({state})")


@replicas.command("remove")
@click.argument("server", metavar="SERVER")
@click.argument("address", metavar="HOST:PORT", callback=_address)
@pass_connection
def remove_replica(conn: Connection, server: str, address: Address) -> None:
    """Stop sending reads to a replica.

    \b
    Example:
        schemaless replicas remove 0 127.0.0.1:3310
    """
    with conn.store() as ds:
        topo = ds.cluster.refresh()
        sid = _server_id(topo, server, "SERVER")
        if not ds.cluster.catalog.remove_replica(sid, address):
            known = ", ".join(str(a) for a in topo.replicas.get(sid, ())) or "none"
            raise CatalogError(
                f"{address} is not a replica of server {sid} (its replicas: {known}): "
                "nothing removed"
            )
    click.echo(f"replica {address} of server {sid}: removed")


@click.group()
@group_connection
def dictionary() -> None:
    """Codec dictionaries: smaller bodies for small entities.

    \b
    Example:
        schemaless dictionary train --samples 5000
    """


@dictionary.command()
@click.option(
    "--samples",
    type=click.IntRange(100, 1_000_000),
    default=5000,
    show_default=True,
    help="Entities to sample, spread over the logical shards.",
)
@click.option(
    "--size",
    type=click.IntRange(1024, 1 << 20),
    default=16384,
    show_default=True,
    help="Dictionary size in bytes.",
)
@pass_connection
def train(conn: Connection, samples: int, size: int) -> None:
    """Train a zstd dictionary on stored entities and use it for new bodies.

    Old bodies name their dictionary and stay readable.

    \b
    Example:
        schemaless dictionary train --samples 5000 --size 16384
    """
    with conn.store() as ds:
        dict_id = ds.train_dictionary(samples=samples, size=size)
    click.echo(f"dictionary {dict_id} trained and active for new bodies")
