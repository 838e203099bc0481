"""``DataStore.from_env``: the datastore the CLI opens, from the environment."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import cluster_env, drop_prefix

from schemaless import CatalogError, DataStore, aio, new_id
from schemaless.local import LocalCluster


@pytest.fixture
def prefix(local_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test cluster as the CLI finds it, with a prefix of the test's own."""
    name = "env_" + uuid.uuid4().hex[:8]
    for key, value in cluster_env(local_cluster, name).items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    yield name
    drop_prefix(local_cluster, name)


def test_the_local_cluster_created_only_when_asked(
    local_cluster: LocalCluster, prefix: str
) -> None:
    with pytest.raises(CatalogError, match=f"schemaless --prefix {prefix} init"):
        DataStore.from_env()
    with DataStore.from_env(create=True, shards=4) as ds:
        topo = ds.cluster.current()
        assert (topo.prefix, topo.n_shards) == (prefix, 4)
        assert sorted(str(a) for a in topo.servers.values()) == sorted(local_cluster.addresses)
        key = new_id()
        ds.put({"id": key, "n": 1})
    with DataStore.from_env() as again:  # opened with the catalog's server
        assert again.get(key) == {"id": key, "n": 1}


def test_a_url_and_the_asyncio_facade(
    local_cluster: LocalCluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEMALESS_URL", local_cluster.addresses[0])
    monkeypatch.setenv("SCHEMALESS_OPTION_FILE", str(local_cluster.option_file))
    monkeypatch.setenv("SCHEMALESS_LOCAL_DIR", "/nonexistent")  # the URL wins

    async def main() -> None:
        ds = aio.DataStore.from_env(create=True, shards=2, pool_size=3)
        key = new_id()
        await ds.put({"id": key, "n": 2})
        assert (await ds.get(key)) == {"id": key, "n": 2}
        assert ds.sync.cluster.current().prefix == prefix
        await ds.close()

    asyncio.run(main())


def test_no_running_cluster_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("SCHEMALESS_URL", "SCHEMALESS_LOCAL_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CatalogError, match="schemaless local up"):
        DataStore.from_env(create=True)
