"""Options every command shares: the connection options before or after the command,
in both programs; a bad option value is one line and exit status 1."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner
from test_cli import Cli, cluster_env, drop_prefix

from schemaless.cleaner.main import main as cleaner
from schemaless.cli.main import cli
from schemaless.local import LocalCluster


@pytest.fixture(scope="module")
def prefix(local_cluster: LocalCluster) -> Iterator[str]:
    """A datastore with one index and one entity; the environment names another."""
    name = "opt_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, name))
    try:
        run.ok("init", "--shards", "4")
        run.ok("index", "create", "by_n", "--property", "n:int")
        run.ok("put", input='{"n": 7, "title": "seven"}\n')
        yield name
    finally:
        drop_prefix(local_cluster, name)


@pytest.fixture
def run(local_cluster: LocalCluster) -> Cli:
    """The CLI with SCHEMALESS_PREFIX naming no datastore: only --prefix finds it."""
    return Cli(cluster_env(local_cluster, "nosuch"))


def test_connection_options_before_or_after_the_command(run: Cli, prefix: str) -> None:
    for args in (
        ["--prefix", prefix, "query", "by_n", "--where", "n=7"],
        ["query", "by_n", "--where", "n=7", "--prefix", prefix],
        ["--prefix", "nosuch", "query", "by_n", "--where", "n=7", "--prefix", prefix],
    ):
        assert "seven" in run.ok(*args).output, args
    assert "by_n" in run.ok("--prefix", prefix, "index", "list").output
    assert "expire" in run.ok("--prefix", prefix, "expiry").output.lower()
    assert "nosuch" in run.fails("--prefix", prefix, "index", "list", "--prefix", "nosuch")
    # and on a group of commands, between the program and the command
    assert "by_n" in run.ok("index", "--prefix", prefix, "list").output
    assert "127.0.0.1" in run.ok("servers", "--prefix", prefix, "list").output
    assert "nosuch" in run.fails("index", "--prefix", "nosuch", "list")
    # the command to run next repeats the options given, wherever they were given
    out = run.ok("--prefix", prefix, "index", "create", "by_title", "--property", "title:str(16)")
    assert f"cleaner --index=by_title --prefix {prefix}" in out.output
    run.ok("index", "drop", "by_title", "--purge", "--prefix", prefix)


def test_the_cleaner_takes_them_in_both_places(local_cluster: LocalCluster, prefix: str) -> None:
    runner = CliRunner(env=cluster_env(local_cluster, "nosuch"))
    for args in (["--prefix", prefix, "verify"], ["verify", "--prefix", prefix]):
        result = runner.invoke(cleaner, args)
        assert result.exit_code == 0 and "by_n" in result.output, (args, result.output)


def _leaves(group: click.Group, path: str) -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaves(command, f"{path} {name}")
        else:
            yield f"{path} {name}", command


def test_every_command_that_connects_takes_them_where_its_group_does() -> None:
    groups = [("schemaless", cli), ("cleaner", cleaner)]
    for program, group in groups:
        assert {"url", "prefix"} <= {p.name for p in group.params}, program
    for name, sub in cli.commands.items():  # every group of commands but `local`
        if isinstance(sub, click.Group) and name != "local":
            assert {"url", "prefix"} <= {p.name for p in sub.params}, name
    leaves = [*_leaves(cli, "schemaless"), *_leaves(cleaner, "cleaner")]
    connecting = [name for name, cmd in leaves if "prefix" in {p.name for p in cmd.params}]
    assert len(connecting) > 20 and all(" local " not in name for name in connecting)
    local = [name for name, _ in leaves if name.startswith("schemaless local ")]
    assert len(connecting) + len(local) == len(leaves), set(dict(leaves)) - set(connecting)


def test_a_bad_column_names_the_valid_ones(run: Cli, prefix: str) -> None:
    args = ["query", "by_n", "--prefix", prefix]
    assert run.ok(*args, "--columns", "title,n").output.splitlines()[0].split() == ["title", "n"]
    line = run.fails(*args, "--columns", "n,nosuch")
    assert "'--columns'" in line and "'nosuch'" in line and "columns: id, n, title" in line
    assert "'--columns'" in run.fails(*args, "--columns", ",")


@pytest.mark.parametrize(
    "args",
    [
        ["query", "by_n", "--limit", "0"],
        ["index", "status", "by_n", "--watch", "nan"],  # nan passed click's FloatRange
        ["shards", "drop-old", "--pause", "nan"],
        ["feeds", "work", "home", "--poll", "inf"],
        ["shards", "--prefix", "Bad Prefix"],
        ["--prefix", "Bad Prefix", "shards"],
    ],
)
def test_bad_option_values_exit_1_in_one_line(run: Cli, prefix: str, args: list[str]) -> None:
    line = run.fails(*args, env={"SCHEMALESS_PREFIX": prefix})
    assert line.startswith("Error: Invalid value for '--")


def test_the_cleaners_bad_values_exit_1_and_usage_errors_exit_2(run: Cli) -> None:
    for args in (["--batch", "0"], ["--part", "1/2", "--once"]):
        result = CliRunner().invoke(cleaner, args)
        assert result.exit_code == 1, result.output
        assert result.output.splitlines() == [result.output.strip()]  # one line
    for argv in (["query"], ["query", "by_n", "--nosuch"], ["nosuch"]):
        assert run(*argv).exit_code == 2, argv


def test_the_cleaner_logs_its_throttle_limits_readably(
    local_cluster: LocalCluster, prefix: str
) -> None:
    runner = CliRunner(env=cluster_env(local_cluster, prefix))
    result = runner.invoke(cleaner, ["--index", "by_n"])
    assert result.exit_code == 0, result.output
    assert "Limits(" not in result.output
    assert "throttle limits: canary p90 at most " in result.output
    assert "ms on server 1; clients' p99 at most " in result.output


def test_init_changes_says_one_true_thing(local_cluster: LocalCluster) -> None:
    name = "feed_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, name))
    try:
        run.ok("init", "--shards", "2")
        out = run.ok("init", "--changes").output.splitlines()
        assert len(out) == 1 and out[0].endswith("; change feed turned on"), out
        again = run.ok("init", "--changes").output.splitlines()
        assert len(again) == 1 and again[0].endswith("; change feed on; nothing changed")
        fresh = Cli(cluster_env(local_cluster, name + "_b")).ok(
            "init", "--changes", "--shards", "2"
        )
        assert fresh.output.startswith("created datastore") and "change feed on" in fresh.output
    finally:
        drop_prefix(local_cluster, name)
        drop_prefix(local_cluster, name + "_b")
