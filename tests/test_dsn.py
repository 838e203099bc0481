"""Server addresses: IPv6 in brackets wherever an address is taken, and nothing after
the port of a DSN silently ignored."""

from __future__ import annotations

import socket
import uuid

import pytest
from click.testing import CliRunner
from conftest import drop_datastore
from test_cli import cluster_env

from schemaless import CatalogError, DataStore, new_id
from schemaless.cli.main import cli
from schemaless.dsn import Address, parse_address
from schemaless.local import LocalCluster


@pytest.mark.parametrize(
    ("spec", "host", "port", "shown"),
    [
        ("[::1]:39861", "::1", 39861, "[::1]:39861"),
        ("[::1]", "::1", 3306, "[::1]:3306"),
        ("[fe80::1]:5", "fe80::1", 5, "[fe80::1]:5"),
        ("mysql://u:pw@[::1]:7", "::1", 7, "[::1]:7"),
        ("mysql://u:pw@[::1]:7/", "::1", 7, "[::1]:7"),
        ("db.example:3307", "db.example", 3307, "db.example:3307"),
    ],
)
def test_ipv6_in_brackets(spec: str, host: str, port: int, shown: str) -> None:
    address, _ = parse_address(spec)
    assert address == Address(host, port) and str(address) == shown


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("::1", "an IPv6 address goes in brackets"),
        ("fe80::1:3306", "an IPv6 address goes in brackets"),
        ("[::1:5", "expected host:port"),
        ("[::1]x", "expected host:port"),
        ("[db]:5", "expected host:port"),
        ("mysql://u:secret@[::1:5", "invalid server address '\\*\\*\\*@"),
        ("mysql://u:secret@h:1/db?x=1", "path or options after the port"),
        ("mysql://u@h:1/db", "path or options after the port"),
        ("mysql://u@h:1?ssl=1", "path or options after the port"),
        ("mysql://u@h:1#x", "path or options after the port"),
    ],
)
def test_refused_addresses(spec: str, needle: str) -> None:
    with pytest.raises(CatalogError, match=needle) as info:
        parse_address(spec)
    assert "secret" not in str(info.value)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.create_connection(("::1", 1), timeout=1):
            pass
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")


@needs_ipv6
def test_a_datastore_and_the_cli_over_ipv6(local_cluster: LocalCluster) -> None:
    """The local servers listen on ::1 too: a datastore made with [::1]:P addresses
    works, and the CLI reaches it with --url [::1]:P and a DSN in brackets."""
    ports = [s.port for s in local_cluster.servers]
    prefix = "v6_" + uuid.uuid4().hex[:10]
    option_file = str(local_cluster.option_file)
    store = DataStore(
        [f"[::1]:{p}" for p in ports], prefix=prefix, shards=4, option_file=option_file
    )
    try:
        key = new_id()
        store.put({"id": key, "n": 1})
        got = store.get(key)
        assert got is not None and got["n"] == 1
        env = {**cluster_env(local_cluster, prefix), "SCHEMALESS_OPTION_FILE": option_file}
        runner = CliRunner(env=env)
        for url in (f"[::1]:{ports[0]}", f"mysql://schemaless@[::1]:{ports[0]}"):
            result = runner.invoke(cli, ["get", key.hex(), "--json", "--url", url])
            assert result.exit_code == 0, result.output
            assert '"n": 1' in result.output
    finally:
        drop_datastore(store)
