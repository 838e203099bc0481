"""The ``schemaless`` command: a click group of the admin commands."""

from __future__ import annotations

import logging

import click

from schemaless import __version__

from .admin import init
from .data import count, delete, get, put, query
from .dump import dump_command, restore_command
from .edges import edges
from .expiry import expiry
from .feed import changes
from .feeds import feeds
from .grants import grants
from .indexes import index
from .local_cluster import local
from .options import Group, connection_options
from .topology import dictionary, replicas, servers, shards

__all__ = ["cli"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, package_name="schemaless-mysql")
@connection_options
def cli(url: str | None, prefix: str) -> None:
    """Administer a schemaless datastore: shards, indexes, entities.

    Every command connects with --url (or SCHEMALESS_URL), the catalog server's
    DSN, and --prefix (or SCHEMALESS_PREFIX), given before the command or after
    it; user and password come from the DSN or SCHEMALESS_USER /
    SCHEMALESS_PASSWORD and are never printed.  With no URL, the local cluster
    (`schemaless local up`) is used.

    \b
    Example:
        schemaless local up
        schemaless init --shards 16
        schemaless index create by_user --property user_id:uuid --shard-on user_id
        schemaless query by_user --where user_id=0190f3a4c2e47b3d8a1f5e6d7c8b9a01
        schemaless --prefix app shards
    """
    _quiet_health(click.get_current_context())


def _quiet_health(ctx: click.Context) -> None:
    """A server marked down is the library's warning for a long-running process (it
    printed before the command's error, in the same words); each command names a server
    that did not answer itself (its error, ``--partial``'s or the worker's warning)."""
    health = logging.getLogger("schemaless.health")
    level = health.level
    health.setLevel(logging.ERROR)
    ctx.call_on_close(lambda: health.setLevel(level))


for command in (
    local,
    init,
    index,
    put,
    get,
    delete,
    query,
    count,
    shards,
    servers,
    replicas,
    dictionary,
):
    cli.add_command(command)
cli.add_command(grants)
cli.add_command(expiry)
cli.add_command(changes)
cli.add_command(dump_command)
cli.add_command(restore_command)
cli.add_command(edges)
cli.add_command(feeds)
