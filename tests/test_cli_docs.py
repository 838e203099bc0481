"""docs/cli.md names every command and option; docs/operations.md, run: every ``$ ``
command of its ``console`` blocks, in order.

``schemaless ...`` runs through click's CliRunner, ``cleaner ...`` through
``schemaless.cleaner.main:main``; a ``<<'EOF'`` here-document is the command's stdin.
Until the Cleaner is importable its steps are replaced by a stand-in that rewrites
every entity (writers maintain a building index) and marks the index ready.
"""

from __future__ import annotations

import importlib
import re
import shlex
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from test_cli import cluster_env, drop_prefix

from schemaless.cleaner.main import main as cleaner_command
from schemaless.cli.main import cli
from schemaless.connect import open_store
from schemaless.local import LocalCluster
from schemaless.names import quote
from schemaless.schema import shard_db

DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDE = DOCS / "operations.md"
_HEADING = re.compile(r"^(#+) (.*)$", re.MULTILINE)
_SHARED = ("--url", "--prefix")  # in "Connecting"


def sections(text: str) -> list[tuple[str, str]]:
    """``(heading, text up to the next heading of its level or above)`` of a page."""
    heads = list(_HEADING.finditer(text))
    out = []
    for i, head in enumerate(heads):
        level = len(head.group(1))
        ends = (h.start() for h in heads[i + 1 :] if len(h.group(1)) <= level)
        out.append((head.group(2), text[head.start() : next(ends, len(text))]))
    return out


def commands(command: click.Command, words: list[str]) -> Iterator[tuple[list[str], click.Command]]:
    """The command path and the command, of ``command`` and of every one under it."""
    yield words, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from commands(sub, [*words, name])


def section_of(words: list[str], pages: list[tuple[str, str]]) -> str:
    """The text of the shortest section whose heading names the command (`index create`,
    `schemaless init`...), else its group's."""
    for n in range(len(words), 0, -1):
        names = [" ".join(words[i:n]) for i in range(n)]
        found = [body for head, body in pages if any(f"`{name}`" in head for name in names)]
        if found:
            return min(found, key=len)
    raise AssertionError(f"no section of docs/cli.md for {' '.join(words)}")


def test_cli_md_names_every_command_and_option() -> None:
    pages = sections((DOCS / "cli.md").read_text())
    connecting = next(body for head, body in pages if head == "Connecting")
    assert all(f"`{option} " in connecting for option in _SHARED)
    for program, root in (("schemaless", cli), ("cleaner", cleaner_command)):
        for words, command in commands(root, [program]):
            body = section_of(words, pages)
            assert words[-1] in body, f"{' '.join(words)}: not in its section"
            for param in command.params:
                names = [*param.opts, *param.secondary_opts]
                for name in names if isinstance(param, click.Option) else ():
                    if name.startswith("--") and name not in ("--help", *_SHARED):
                        assert name in body, f"{' '.join(words)} {name}: not in its section"


_BLOCK = re.compile(r"^```console\n(.*?)^```", re.DOTALL | re.MULTILINE)
_HEREDOC = re.compile(r"\s*<<-?\s*'?(\w+)'?\s*$")


@dataclass(frozen=True)
class Step:
    argv: list[str]
    stdin: str | None
    line: str


def steps(text: str) -> list[Step]:
    """The ``$ `` commands of the ``console`` blocks, with their here-documents."""
    out = []
    for block in _BLOCK.findall(text):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.startswith("$ "):
                continue
            command = line[2:]
            stdin = None
            heredoc = _HEREDOC.search(command)
            if heredoc:
                command = command[: heredoc.start()]
                body = []
                while lines[i] != heredoc.group(1):
                    body.append(lines[i])
                    i += 1
                i += 1
                stdin = "\n".join(body) + "\n"
            out.append(Step(shlex.split(command), stdin, line))
    return out


def cleaner_main() -> click.Command | None:
    try:
        module = importlib.import_module("schemaless.cleaner.main")
    except ImportError:
        return None
    main = getattr(module, "main", None)
    return main if isinstance(main, click.Command) else None


def stand_in_backfill(prefix: str, local_dir: str, index: str) -> None:
    """What ``cleaner --index=NAME`` achieves, done the slow way: rewrite every entity
    (writers maintain a building index), then mark the index ready."""
    with open_store(prefix=prefix, local_dir=local_dir) as ds:
        topo = ds.cluster.refresh()
        for shard in range(topo.n_shards):
            server = ds.cluster.server_of_shard(topo, shard)
            table = quote(shard_db(prefix, shard), "entities")
            rows = server.run(f"SELECT `id` FROM {table} WHERE `body` IS NOT NULL")[0]
            found = [e for e in ds.get_many([bytes(r[0]) for r in rows]) if e is not None]
            if found:
                ds.put_many([dict(e) for e in found])
        ds.cluster.catalog.set_index_state(index, "ready", expect="building")


def test_guide_has_the_whole_story() -> None:
    commands = [" ".join(s.argv[:3]) for s in steps(GUIDE.read_text())]
    assert commands[:2] == ["schemaless local up", "schemaless init --shards"]
    for needed in (
        "schemaless index create",
        "schemaless index status",
        "cleaner --index=by_link",
        "schemaless query by_link",
        "schemaless index drop",
    ):
        assert any(c.startswith(needed) for c in commands), needed


@pytest.fixture
def prefix(local_cluster: LocalCluster) -> Iterator[str]:
    name = "docs_" + uuid.uuid4().hex[:8]
    try:
        yield name
    finally:
        drop_prefix(local_cluster, name)


def test_operations_guide_runs(local_cluster: LocalCluster, prefix: str) -> None:
    env = cluster_env(local_cluster, prefix)
    runner = CliRunner(env=env)
    cleaner = cleaner_main()
    outputs: list[str] = []
    for step in steps(GUIDE.read_text()):
        program, *args = step.argv
        if program == "schemaless":
            result = runner.invoke(cli, args, input=step.stdin, catch_exceptions=False)
        elif program == "cleaner":
            if cleaner is None:
                index = next(a.split("=", 1)[1] for a in args if a.startswith("--index="))
                stand_in_backfill(prefix, str(local_cluster.base_dir), index)
                continue
            result = runner.invoke(cleaner, args, input=step.stdin, catch_exceptions=False)
        else:
            pytest.fail(f"docs/operations.md runs an unknown program: {step.line}")
        assert result.exit_code == 0, f"{step.line}\n{result.output}"
        outputs.append(result.output)
    joined = "\n".join(outputs)
    assert "index by_link is building" in joined
    assert "index by_link: ready" in joined
    assert "How FriendFeed uses MySQL" in joined  # the query found the backfilled entity
    assert "index by_link purged" in joined
