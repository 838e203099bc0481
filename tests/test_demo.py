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
    store = DataStore(
        local_cluster.addresses[:1],
        option_file=str(local_cluster.option_file),
        prefix=prefix,
        create=False,
    )
    drop_datastore(store)
