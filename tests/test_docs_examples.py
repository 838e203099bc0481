"""The README's Python examples and the package docstring's, run against real servers.

The README's run as a newcomer would: in a fresh directory, after ``schemaless local
up`` and the demo (``make demo``'s command), every block in order in one namespace,
as written; the one for your own servers (``"db1:3306"``...) gets the local cluster's
addresses and the option file ``local up`` printed.  The package docstring's run on
the test cluster with a prefix of the test's own.  ``bump`` and ``search`` are the
names the README leaves to the reader.
"""

from __future__ import annotations

import ast
import asyncio
import doctest
import inspect
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli import drop_prefix

import schemaless
from schemaless.local import LocalCluster

README = Path(__file__).resolve().parent.parent / "README.md"
_PYTHON = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
_SERVERS = re.compile(r'\[("(?:127\.0\.0\.1|db\d+):\d+"(?:, )?)+\]')
_ENV = ("URL", "PREFIX", "USER", "PASSWORD", "OPTION_FILE", "LOCAL_DIR")


def on_test_servers(source: str) -> tuple[str, int]:
    """``source`` with each list of example servers made the test cluster's, and how
    many lists there were."""

    def servers(match: re.Match[str]) -> str:
        return f"SERVERS[:{match.group(0).count(':')}], prefix=PREFIX"

    return _SERVERS.subn(servers, source)


def schemaless_cli(*args: str) -> str:
    """Run the installed ``schemaless`` command here; its output (exit 0 asserted)."""
    command = Path(sys.executable).parent / "schemaless"
    done = subprocess.run(
        [str(command), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def newcomer(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """A fresh current directory with no ``SCHEMALESS_*`` variables, where
    ``schemaless local up`` has started its cluster (``local down`` afterwards)."""
    home = Path(tempfile.mkdtemp(prefix="sl-readme-"))  # short: the servers' sockets
    for name in _ENV:
        monkeypatch.delenv("SCHEMALESS_" + name, raising=False)
    monkeypatch.chdir(home)
    try:
        assert "2 servers running" in schemaless_cli("local", "up", "--fast")
        yield LocalCluster()
    finally:
        schemaless_cli("local", "down")
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def namespace(
    local_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """Globals for the docstring's examples: the servers, a prefix dropped afterwards,
    credentials from the cluster's option file."""
    monkeypatch.setenv("SCHEMALESS_OPTION_FILE", str(local_cluster.option_file))
    prefix = "docs_" + uuid.uuid4().hex[:8]
    ns: dict[str, Any] = {"SERVERS": local_cluster.addresses, "PREFIX": prefix}
    try:
        yield ns
    finally:
        drop_prefix(local_cluster, prefix)


class _Search(dict[bytes, Any]):
    """The search index the change feed's example keeps up to date."""

    def upsert(self, key: bytes, entity: dict[str, Any]) -> None:
        self[key] = entity

    def remove(self, key: bytes) -> None:
        self.pop(key, None)


def run_block(source: str, ns: dict[str, Any]) -> None:
    """Run a block; one with top-level ``await`` as a coroutine."""
    code = compile(source, str(README), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, ns)
    if inspect.iscoroutine(result):
        asyncio.run(result)


def test_readme_examples_run_as_written(
    newcomer: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo = subprocess.run(
        [sys.executable, "-m", "schemaless.demo", "--entries", "300"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert demo.returncode == 0 and "all equal to what was put" in demo.stdout, demo.stderr
    blocks = _PYTHON.findall(README.read_text())
    # from_env, own servers, asyncio, documents (3), the change feed, edges and timelines
    assert len(blocks) == 8
    # what `schemaless local up` prints for connecting explicitly
    monkeypatch.setenv("SCHEMALESS_OPTION_FILE", str(newcomer.option_file))
    ns: dict[str, Any] = {"SERVERS": newcomer.addresses, "PREFIX": "schemaless"}
    ns["bump"] = lambda entity: {**entity, "bumped": True}
    ns["search"] = search = _Search()
    opened: dict[int, schemaless.DataStore] = {}
    rewritten = []
    try:
        for n, block in enumerate(blocks):
            source, lists = on_test_servers(block)
            if lists:
                rewritten.append(n)
            run_block(source, ns)
            opened.update((id(v), v) for v in ns.values() if isinstance(v, schemaless.DataStore))
            if n == 0:  # the first example made the datastore the CLI's init expects
                assert ns["datastore"].cluster.current().n_shards == 16
                assert ns["datastore"].cluster.current().prefix == "schemaless"
        assert rewritten == [1]  # the others ran exactly as written
        datastore, entity, entry = ns["datastore"], ns["entity"], ns["entry"]
        assert datastore.get(entity["id"]) == entity
        bumped = {**entry, "bumped": True}
        found = ns["user_id_index"].get_all(datastore, user_id=ns["user"])
        assert sorted(found, key=lambda e: e["title"]) == [entity, bumped]
        assert [e["title"] for e in ns["page"]] == ["hello", entity["title"]]  # desc
        assert isinstance(ns["version"], int) and ns["found"]["id"] in (entity["id"], entry["id"])
        assert search[entity["id"]] == entity  # the feed's snapshot reached it
        assert ns["likes"].count_inverse(ns["photo"]) == 2
        assert ns["home"].home(ns["ann"])[0]["author"] == ns["bob"]
        for block in blocks:  # run again, as a reader trying them twice: they still hold
            run_block(on_test_servers(block)[0], ns)
            opened.update((id(v), v) for v in ns.values() if isinstance(v, schemaless.DataStore))
    finally:
        for store in opened.values():
            store.close()
    # the README's next command finds the same datastore
    assert "already exists: 16 logical shards" in schemaless_cli("init", "--shards", "16")


def test_package_docstring_example_runs(namespace: dict[str, Any]) -> None:
    assert schemaless.__doc__ is not None
    text, lists = on_test_servers(schemaless.__doc__)
    assert lists == 1
    test = doctest.DocTestParser().get_doctest(text, namespace, "schemaless", None, 0)
    assert len(test.examples) >= 6
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
