"""``schemaless put``'s input: UTF-8 (a byte order mark allowed), and every error names
the source (stdin or the file) and the line of the entity."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli import Cli, cluster_env, drop_prefix

from schemaless.cli.main import cli
from schemaless.local import LocalCluster


@pytest.fixture(scope="module")
def run(local_cluster: LocalCluster) -> Iterator[Cli]:
    """A datastore with an index of str(8) titles."""
    prefix = "put_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        run.ok("init", "--shards", "4")
        run.ok("index", "create", "by_title", "--property", "title:str(8)")
        yield run
    finally:
        drop_prefix(local_cluster, prefix)


def fails(run: Cli, *args: str, input: bytes | None = None) -> str:
    """The one error line of a command given bytes on stdin (exit 1, no traceback)."""
    result = CliRunner(env=run.env).invoke(cli, list(args), input=input)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def lines(n: int, bad: int, text: str = "ok") -> list[str]:
    return [json.dumps({"title": text if i != bad else "far too long"}) for i in range(1, n + 1)]


def test_input_that_is_not_utf8_names_the_source_line_and_byte(run: Cli, tmp_path: Path) -> None:
    data = b'{"title": "a"}\n{"title": "caf\xe9"}\n'
    line = fails(run, "put", input=data)
    assert "stdin line 2: not UTF-8 text (byte 0xe9 at offset 29)" in line
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(data)
    assert f"{path} line 2: not UTF-8" in fails(run, "put", "--file", str(path))
    assert "by_title" in run.ok("index", "list").output
    assert "no matching entities" in run.ok("query", "by_title").output  # nothing stored


def test_a_utf8_byte_order_mark_is_accepted(run: Cli, tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + '{"title": "café"}\n{"title": "b"}\n'.encode())
    result = CliRunner(env=run.env).invoke(cli, ["put", "--file", str(path), "--json"])
    assert result.exit_code == 0, result.output
    key = json.loads(result.stdout.splitlines()[0])["id"]
    assert '"title": "café"' in run.ok("get", key, "--json").output
    one = CliRunner(env=run.env).invoke(cli, ["put"], input='\ufeff{"title": "c"}'.encode())
    assert one.exit_code == 0, one.output


def test_errors_name_the_file_and_line(run: Cli, tmp_path: Path) -> None:
    """A value that does not fit an index, in the second batch of 500, names its line
    (it had no id: the one generated is not what the user can find); a JSON error in a
    file names the file, not stdin."""
    path = tmp_path / "posts.jsonl"
    path.write_text("\n".join(lines(700, bad=601)) + "\n")
    line = fails(run, "put", "--file", str(path))
    assert f"{path} line 601: entity " in line and "longer than str(8)" in line
    assert "(500 entities were stored before this)" in line
    path.write_text("\n".join([*lines(3, bad=0), '{"title": ']) + "\n")
    line = fails(run, "put", "--file", str(path))
    assert f"{path} line 4: invalid JSON" in line and "stdin" not in line
    assert "stdin item 2: entity " in fails(run, "put", input=b'[{"t": 1}, {"title": "123456789"}]')
    assert "stdin: entity " in fails(run, "put", input=b'{"title": "123456789"}')
    assert "no entities in stdin" in fails(run, "put", input=b"\n")


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's procfs")
def test_a_file_that_cannot_be_read_is_one_line_naming_it(run: Cli) -> None:
    """Reading /proc/self/mem from its start fails (EIO) even for root, as an unreadable
    file does for a user: it was a Python traceback."""
    line = fails(run, "put", "--file", "/proc/self/mem")
    assert line == "Error: cannot read /proc/self/mem: Input/output error", line
