"""``schemaless expiry``: show or set the property that holds entities' expiry times."""

from __future__ import annotations

import click

from schemaless.errors import SchemalessError
from schemaless.expiry import check_property

from .options import BadOption, Connection, pass_connection

__all__ = ["expiry", "expiry_property"]


def expiry_property(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: a valid expiry property name (or None)."""
    if value is None:
        return None
    try:
        return check_property(value)
    except SchemalessError as exc:
        hint = param.opts[0] if isinstance(param, click.Option) else "PROPERTY"
        raise BadOption(str(exc), hint) from None


@click.command()
@click.argument("prop", metavar="[PROPERTY]", required=False, callback=expiry_property)
@click.option("--off", is_flag=True, help="Entities no longer expire (their property stays).")
@pass_connection
def expiry(conn: Connection, prop: str | None, off: bool) -> None:
    """Show or set the property that holds each entity's expiry time.

    Its value is a time in Unix epoch seconds (int or float); an entity whose
    time has passed is never read again and the Cleaner deletes it.  Clients
    learn a change at their next catalog refresh.

    \b
    Example:
        schemaless expiry
        schemaless expiry expires_at
        schemaless expiry --off
    """
    if off and prop is not None:
        raise BadOption("give a PROPERTY or --off, not both", "--off")
    with conn.store() as ds:
        catalog = ds.cluster.catalog
        if off or prop is not None:
            catalog.set_expire_on(prop, replace=True)
        now = ds.cluster.refresh().expire_on
    if now is None:
        click.echo(f"datastore {conn.prefix!r}: entities never expire")
    else:
        click.echo(f"datastore {conn.prefix!r}: entities expire at the time in {now!r}")
