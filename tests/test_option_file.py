"""A named option file that cannot be read is a typed error, not a silent fall-back
to the driver's defaults (it used to connect as the OS user, without a password)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from schemaless import CatalogError, DataStore
from schemaless.cli.main import cli
from schemaless.local import LocalCluster


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_an_unreadable_option_file_is_refused(
    local_cluster: LocalCluster, tmp_path: Path, kind: str
) -> None:
    named = tmp_path / "missing.cnf" if kind == "missing" else tmp_path
    with pytest.raises(CatalogError, match="option file") as caught:
        DataStore(local_cluster.addresses, option_file=str(named), create=False)
    assert str(named) in str(caught.value)
    env = {
        "SCHEMALESS_URL": local_cluster.addresses[0],
        "SCHEMALESS_OPTION_FILE": str(named),
        "SCHEMALESS_USER": None,
        "SCHEMALESS_PASSWORD": None,
    }
    for args in (["shards"], ["init", "--shards", "4"]):
        done = CliRunner(env=env).invoke(cli, args)
        assert done.exit_code == 1, (done.output, done.exception)
        assert "option file" in done.stderr and "Access denied" not in done.stderr


def test_a_readable_option_file_still_connects(local_cluster: LocalCluster) -> None:
    done = CliRunner(
        env={
            "SCHEMALESS_URL": local_cluster.addresses[0],
            "SCHEMALESS_OPTION_FILE": str(local_cluster.option_file),
            "SCHEMALESS_PREFIX": "no_such_prefix_here",
            "SCHEMALESS_USER": None,
            "SCHEMALESS_PASSWORD": None,
        }
    ).invoke(cli, ["shards"])
    assert done.exit_code == 1 and "no datastore" in done.stderr, done.output
