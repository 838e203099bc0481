"""The README's first command: the demo runs end to end on the local cluster."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from conftest import drop_datastore

from schemaless import DataStore
from schemaless.demo import main


def test_demo_stores_reads_and_reports(
    local_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = "demo_" + uuid.uuid4().hex[:8]
    main(
        [
            "--entries",
            "300",
            "--users",
            "5",
            "--shards",
            "4",
            "--prefix",
            prefix,
            "--dir",
            str(local_cluster.base_dir),
        ]
    )
    out = capsys.readouterr().out
    assert "put_many 300 entries" in out
    assert "all equal to what was put" in out
    assert out.count("logical shards,") == 2  # entities per server, both servers
    counts = [
        int(line.split(", ")[1].split()[0])
        for line in out.splitlines()
        if "logical shards," in line
    ]
    assert sum(counts) == 300 and all(counts)
    hint = f"DataStore.from_env(prefix={prefix!r}, local_dir={str(local_cluster.base_dir)!r})"
    assert hint in out
    store = eval(hint, {"DataStore": DataStore})  # as printed
    assert store.cluster.current().n_shards == 4
    drop_datastore(store)
