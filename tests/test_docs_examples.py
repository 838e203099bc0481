"""The README's Python examples and the package docstring's, run against real servers.

The blocks run in order in one namespace, as a reader would type them; the servers
they name (``"127.0.0.1:3306"``...) become the test cluster's, with a prefix of the
test's own.  ``bump`` and ``search`` are the names the README leaves to the reader.
"""

from __future__ import annotations

import ast
import asyncio
import doctest
import inspect
import re
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
_SERVERS = re.compile(r'\[("127\.0\.0\.1:\d+"(?:, )?)+\]')


def on_test_servers(source: str) -> str:
    """``source`` with each list of example servers made the test cluster's."""

    def servers(match: re.Match[str]) -> str:
        return f"SERVERS[:{match.group(0).count(':')}], prefix=PREFIX"

    changed, n = _SERVERS.subn(servers, source)
    assert n, f"no example servers in:\n{source}"
    return changed


@pytest.fixture
def namespace(
    local_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """Globals for the examples: the servers, a prefix dropped afterwards, credentials
    from the cluster's option file."""
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


def test_readme_examples_run(namespace: dict[str, Any]) -> None:
    blocks = _PYTHON.findall(README.read_text())
    assert len(blocks) == 3  # the synchronous API, asyncio, the change feed
    ns = namespace
    ns["bump"] = lambda entity: {**entity, "bumped": True}
    ns["search"] = search = _Search()
    try:
        for block in blocks:
            run_block(on_test_servers(block), ns)
        datastore, entity, entry = ns["datastore"], ns["entity"], ns["entry"]
        assert datastore.get(entity["id"]) == entity
        bumped = {**entry, "bumped": True}
        found = ns["user_id_index"].get_all(datastore, user_id=ns["user"])
        assert sorted(found, key=lambda e: e["title"]) == [entity, bumped]
        assert [e["title"] for e in ns["page"]] == ["hello", entity["title"]]  # desc
        assert isinstance(ns["version"], int) and ns["found"]["id"] in (entity["id"], entry["id"])
        assert search[entity["id"]] == entity  # the feed's snapshot reached it
    finally:
        if "datastore" in ns:
            ns["datastore"].close()


def test_package_docstring_example_runs(namespace: dict[str, Any]) -> None:
    assert schemaless.__doc__ is not None
    text = on_test_servers(schemaless.__doc__)
    test = doctest.DocTestParser().get_doctest(text, namespace, "schemaless", None, 0)
    assert len(test.examples) >= 6
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
