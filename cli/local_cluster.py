"""``schemaless local``: the local cluster of real mariadbd processes.

:mod:`schemaless.local` is imported by the commands that use it, not when the CLI
starts (it is development tooling).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .options import BadOption, Group
from .output import echo_table

if TYPE_CHECKING:
    from schemaless.local import LocalCluster

__all__ = ["local"]

#: The exit status of ``status`` where the folder holds no cluster (LSB's and
#: ``pg_ctl status``'s "not running"), so a script can tell it from an error.
NOT_RUNNING = 3

dir_option = click.option(
    "--dir",
    "base_dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="SCHEMALESS_LOCAL_DIR",
    show_envvar=True,
    help="The cluster's folder [default: ./.schemaless-local].",
)


def _cluster(base_dir: Path | None, servers: int = 2, durable: bool = True) -> LocalCluster:
    from schemaless.local import LocalCluster

    return LocalCluster(base_dir, servers=servers, durable=durable)


def _echo_servers(cluster: LocalCluster) -> None:
    rows = [
        [
            str(s["index"]),
            str(s["address"]),
            "paused" if s["paused"] else "yes" if s["running"] else "no",
            str(s["pid"] or "-"),
            str(s["datadir"]),
        ]
        for s in cluster.status()
    ]
    echo_table(["server", "address", "running", "pid", "data"], rows)


@click.group(cls=Group)
def local() -> None:
    """Run a local cluster of MariaDB servers.

    For development, the demo and the tests.  The other commands use it when
    neither --url nor SCHEMALESS_URL is given.

    \b
    Example:
        schemaless local up --servers 2
        schemaless local status
    """


@local.command()
@dir_option
@click.option(
    "--servers", type=click.IntRange(1, 16), default=2, show_default=True, help="How many."
)
@click.option(
    "--durable/--fast",
    default=True,
    show_default=True,
    help="--fast: do not flush the log at every commit (tests, demos).",
)
def up(base_dir: Path | None, servers: int, durable: bool) -> None:
    """Create and start the local cluster (servers already running are left alone).

    The application user's password is written to the folder's client.cnf
    (mode 0600) and never printed.

    \b
    Example:
        schemaless local up
        schemaless local up --dir /tmp/sl --servers 3 --fast
    """
    cluster = _cluster(base_dir, servers, durable)
    starting = sum(not s.running() for s in cluster.servers)
    starting += max(0, servers - len(cluster.servers))
    if starting:
        plural = "s" if starting > 1 else ""
        click.echo(f"starting {starting} server{plural} in {cluster.base_dir} ...", err=True)
    cluster.up()
    click.echo(f"local cluster in {cluster.base_dir}: {len(cluster.servers)} servers running")
    _echo_servers(cluster)
    click.echo()
    from schemaless.local import default_base_dir

    if cluster.base_dir == default_base_dir():
        click.echo("schemaless commands run here use it by default, e.g.:")
    else:
        click.echo("use it from schemaless commands with:")
        click.echo(f"  export SCHEMALESS_LOCAL_DIR={cluster.base_dir}")
    click.echo("  schemaless init --shards 16")
    click.echo("or connect to it explicitly (the password stays in the option file):")
    click.echo(
        f"  export SCHEMALESS_URL={cluster.addresses[0]} "
        f"SCHEMALESS_OPTION_FILE={cluster.option_file}"
    )


@local.command()
@dir_option
@click.option(
    "--server",
    "only",
    type=click.IntRange(min=0),
    metavar="N",
    help="Stop server N alone (to try a partial cluster; `up` starts it again).",
)
def down(base_dir: Path | None, only: int | None) -> None:
    """Stop the local cluster's servers (the data stays; `up` starts them again).

    \b
    Example:
        schemaless local down
        schemaless local down --server 1
    """
    cluster = _cluster(base_dir)
    if not cluster.servers:
        click.echo(f"no local cluster in {cluster.base_dir}")
        return
    if only is not None:
        _stop_one(cluster, only)
        return
    running = sum(1 for s in cluster.servers if s.pid() is not None)
    cluster.down()
    click.echo(f"stopped {running} of {len(cluster.servers)} servers in {cluster.base_dir}")


def _stop_one(cluster: LocalCluster, i: int) -> None:
    """Stop server ``i`` of the cluster, the others left running."""
    if i >= len(cluster.servers):
        n = len(cluster.servers)
        raise BadOption(f"no server {i}: the cluster has {n} (0 to {n - 1})", "--server")
    if cluster.servers[i].pid() is None:
        click.echo(f"server {i} ({cluster.addresses[i]}) was not running")
        return
    cluster.stop_server(i)
    click.echo(f"server {i} ({cluster.addresses[i]}) stopped: `schemaless local up` starts it")


@local.command()
@dir_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
def status(base_dir: Path | None, as_json: bool) -> None:
    """Show the local cluster: servers, ports, pids, data folders, running or not.

    \b
    Example:
        schemaless local status
    """
    cluster = _cluster(base_dir)
    if as_json:
        out: dict[str, Any] = {
            "dir": str(cluster.base_dir),
            "option_file": str(cluster.option_file),
            "servers": cluster.status(),
        }
        click.echo(json.dumps(out, sort_keys=True))
        return
    if not cluster.servers:
        click.echo(f"no local cluster in {cluster.base_dir}: start one with `schemaless local up`")
        click.get_current_context().exit(NOT_RUNNING)
    servers = cluster.status()
    up_count = sum(1 for s in servers if s["running"])
    paused = [str(s["pid"]) for s in servers if s["paused"]]
    resume = f" ({len(paused)} paused: `kill -CONT {' '.join(paused)}` resumes them)"
    click.echo(
        f"local cluster in {cluster.base_dir}: {up_count} of {len(cluster.servers)} servers"
        f" running{resume if paused else ''}"
    )
    _echo_servers(cluster)
    click.echo(f"option file (user and password): {cluster.option_file}")
