"""``schemaless grants``: the least-privilege GRANT statements of a role, from the catalog."""

from __future__ import annotations

import click

from schemaless.grants import ROLES, GrantError, account, apply_grants, grant_plan

from .options import BadOption, Connection, pass_connection

__all__ = ["grants"]

_ROLES = {
    "app": "the application: reads the catalog, reads and writes entities and index rows",
    "cleaner": "the Cleaner: index rows, checkpoints, fencing tombstones; no entity bodies",
    "admin": "init, indexes, shard moves, dictionaries: every privilege on the datastore",
}


#: The owned layout's guard triggers and binary logging (docs/reliability.md).
_TRIGGERS = (
    "the owned layout's tables have triggers, whose definer this user becomes: with "
    "binary logging on, creating them needs SUPER or log_bin_trust_function_creators = 1"
)


def _check_user(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        account(value, "%")
    except GrantError as exc:
        raise BadOption(str(exc), "--user") from None
    return value


def _check_host(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        account("user", value)
    except GrantError as exc:
        raise BadOption(str(exc), "--host") from None
    return value


@click.command()
@click.argument("role", metavar="ROLE", type=click.Choice(ROLES))
@click.option(
    "--user", "name", required=True, metavar="NAME", callback=_check_user, help="The user name."
)
@click.option(
    "--host",
    default="%",
    show_default=True,
    callback=_check_host,
    help="The user's host part: a host name, an IP address or a pattern with '%'.",
)
@click.option(
    "--apply",
    "apply",
    is_flag=True,
    help="Run the statements on their servers (the connecting user needs the GRANT "
    "OPTION; the user must exist on every server).",
)
@pass_connection
def grants(conn: Connection, role: str, name: str, host: str, apply: bool) -> None:
    """Print (or --apply) the GRANT statements of a least-privilege ROLE.

    \b
    app      the application: no DDL anywhere
    cleaner  the Cleaner: never writes or deletes an entity body
    admin    init, index create/drop/purge, shard moves, dictionaries

    The statements name concrete databases and tables (column-level grants
    cannot use wildcards), so run this again after `index create` and, in the
    databases layout, after shard moves. Each block runs on the server named above it. Grants only
    add privileges: nothing is revoked, and no user is created.

    \b
    Example:
        schemaless grants app --user app > app-grants.sql
        schemaless grants cleaner --user cleaner --host 10.0.0.% --apply
    """
    who = account(name, host)
    with conn.store() as ds:
        if apply:
            done = apply_grants(ds, role, who)
            for address, count in done.items():
                click.echo(f"{address}: {count} grants applied to {who} (role {role})")
            return
        plan = grant_plan(ds, role, who)
        topo = ds.cluster.current()
        catalog_at = ds.cluster.catalog.server.address
        click.echo(f"-- role {role} ({_ROLES[role]})")
        click.echo(f"-- for {who} on datastore {topo.prefix!r}: run each block on its server")
        if role == "admin" and topo.owned_db is not None:
            click.echo(f"-- {_TRIGGERS}")
        by_address = {address: sid for sid, address in topo.servers.items()}
        for address, statements in plan.items():
            sid = by_address.get(address)
            holds = len(topo.shards_of(sid)) if sid is not None else 0
            what = ["the catalog"] if address == catalog_at else []
            what.append(f"{holds} of {topo.n_shards} logical shards")
            click.echo(f"\n-- on {address} (server {sid}: {', '.join(what)})")
            for sql in statements:
                click.echo(f"{sql};")
            if not statements:
                click.echo("-- nothing to grant here")
