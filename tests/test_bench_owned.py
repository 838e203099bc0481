"""``python -m bench.owned`` at a tiny size on the session cluster: every cell measured
through the library, the figures' tables written, its databases dropped."""

from __future__ import annotations

from bench.env import Servers
from bench.owned import OwnedConfig, format_markdown, run
from schemaless.local import LocalCluster


def _databases(servers: Servers, prefix: str) -> list[str]:
    rows = servers.admin(0, "SHOW DATABASES") + servers.admin(1, "SHOW DATABASES")
    return sorted(r[0] for r in rows if r[0].startswith(f"{prefix}_"))


def test_owned_benchmark_runs_every_cell(local_cluster: LocalCluster) -> None:
    servers = Servers(tuple(local_cluster.addresses), str(local_cluster.option_file))
    cfg = OwnedConfig(
        entities=300, per_server=[2], write_per_server=2, rounds=1, slice_ops=2, prefix="bo"
    )
    results = run(cfg, servers=servers)
    reads, writes = results["reads"], results["writes"]
    assert set(reads["init_s"]) == {2}
    assert set(reads["ops"]["get_many"]) == {"raw", "owned 2"}
    assert set(reads["ops"]["scatter"]) == {"owned 2"}
    ops = {f"{op}_{n}idx" for op in ("put", "update", "delete") for n in (0, 1, 3)}
    assert set(writes) == ops | {"get", "query_eq", "query_eq20"}
    assert all(set(by) == {"owned", "databases"} for by in writes.values())
    assert all(r["ops"] == 2 for by in writes.values() for r in by.values())
    table = format_markdown(results)
    assert "| get_many | owned 2 |" in table and "| put_3idx | databases |" in table
    assert _databases(servers, "bo") == []
