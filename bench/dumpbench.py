"""Dump and restore of the 3-index datastore against mysqldump of the same databases.

* **schemaless dump** (``schemaless.dump.dump``) in both encodings (``jsonl``,
  ``native``), every logical shard in its own consistent snapshot, 4 at once;
* **schemaless restore** of each into a new datastore with half the logical shards
  (``<prefix>_rj`` / ``_rn``), then the Cleaner's backfill of its 3 indexes in this
  process (timed apart: the restore proper, then the indexes);
* **mysqldump** (``mariadb-dump --single-transaction --quick``) of the same
  databases (each logical shard's, or each server's data database in the owned layout:
  entities and index tables, a physical copy of the same layout, no resharding), one
  process per database, servers in parallel; and its
  restore with the ``mariadb`` client into ``<prefix>_md_NNNN``.

Rates are entities per second; sizes are the dump files' bytes.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from schemaless import DataStore
from schemaless.cleaner.daemon import Cleaner
from schemaless.dump import dump, restore
from schemaless.schema import shard_db

from .env import Servers
from .ops import Bench

__all__ = ["dump_bench"]


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir())


def _rate(n: int, seconds: float) -> dict[str, float]:
    return {"seconds": round(seconds, 3), "per_s": round(n / seconds, 1) if seconds else 0.0}


def _schemaless(b: Bench, tmp: Path, encoding: str, n_shards: int) -> dict[str, Any]:
    src = b.stores["i3"]
    out = tmp / encoding
    t0 = time.perf_counter()
    manifest = dump(src, out, encoding=encoding, workers=4)
    dumped = time.perf_counter() - t0
    n = sum(manifest["files"].values())
    target = DataStore(
        list(b.servers.addresses),
        prefix=f"{b.prefix}_r{encoding[0]}",
        shards=n_shards,
        option_file=b.servers.option_file,
        refresh_interval=0.5,
    )
    try:
        t0 = time.perf_counter()
        building = restore(target, out, workers=4)
        restored = time.perf_counter() - t0
        t0 = time.perf_counter()  # the grace period (two refresh intervals) included
        states = [Cleaner(target).backfill(name) for name in building]
        indexed = time.perf_counter() - t0
    finally:
        target.close()
    return {
        "entities": n,
        "bytes": _size(out),
        "dump": _rate(n, dumped),
        "restore": _rate(n, restored),
        "backfill": {**_rate(n, indexed), "indexes": len(building), "states": states},
        "target_shards": n_shards,
    }


def _client(servers: Servers, i: int, program: str, *args: str) -> list[str]:
    host, _, port = servers.addresses[i].rpartition(":")
    return [program, f"--defaults-extra-file={servers.option_file}", "-h", host, "-P", port, *args]


def _mysqldump(b: Bench, tmp: Path, n: int) -> dict[str, Any]:
    """mariadb-dump of every i3 database (a logical shard's, or in the owned layout
    the server's data database, its guard triggers left out), then the mariadb client
    back into ``<prefix>_md_NNNN``."""
    dbs = b.stores["i3"].cluster.current().dbs
    per_server: dict[int, dict[str, int]] = {}
    for shard, sid in enumerate(b.shard_sid):
        per_server.setdefault(sid, {}).setdefault(dbs[shard], shard)
    out = tmp / "mysqldump"
    out.mkdir()

    def dump_server(sid: int) -> None:
        for db, k in per_server[sid].items():
            with open(out / f"{k:04d}.sql", "wb") as f:
                args = ["--single-transaction", "--quick", "--skip-triggers", db]
                subprocess.run(_client(b.servers, sid, "mariadb-dump", *args), stdout=f, check=True)

    def load_server(sid: int) -> None:
        for k in per_server[sid].values():
            db = shard_db(f"{b.prefix}_md", k)
            subprocess.run(
                _client(b.servers, sid, "mariadb", "-e", f"CREATE DATABASE IF NOT EXISTS `{db}`"),
                check=True,
            )
            with open(out / f"{k:04d}.sql", "rb") as f:
                subprocess.run(_client(b.servers, sid, "mariadb", db), stdin=f, check=True)

    with ThreadPoolExecutor(len(per_server)) as pool:
        t0 = time.perf_counter()
        list(pool.map(dump_server, per_server))
        dumped = time.perf_counter() - t0
        t0 = time.perf_counter()
        list(pool.map(load_server, per_server))
        loaded = time.perf_counter() - t0
    return {
        "entities": n,
        "bytes": _size(out),
        "dump": _rate(n, dumped),
        "restore": _rate(n, loaded),
    }


def dump_bench(b: Bench, cfg: Any) -> dict[str, Any]:
    """The figures of the module docstring; ratios are schemaless rate / mysqldump rate."""
    with tempfile.TemporaryDirectory(prefix="schemaless-dumpbench-") as tmp:
        target_shards = max(1, cfg.shards // 2)
        results: dict[str, Any] = {
            enc: _schemaless(b, Path(tmp), enc, target_shards) for enc in ("jsonl", "native")
        }
        results["mysqldump"] = md = _mysqldump(b, Path(tmp), results["jsonl"]["entities"])
    for enc in ("jsonl", "native"):
        r = results[enc]
        for step in ("dump", "restore"):
            r[step]["vs_mysqldump"] = round(r[step]["per_s"] / md[step]["per_s"], 3)
    return results


def format_dump(d: dict[str, Any]) -> str:
    """The dump figures as text."""
    md = d["mysqldump"]
    lines = [f"dump and restore of {md['entities']} entities (3 indexes):"]
    for name in ("jsonl", "native", "mysqldump"):
        r = d[name]
        line = (
            f"  {name:<10} dump {r['dump']['per_s']:>9.0f}/s"
            f"  restore {r['restore']['per_s']:>9.0f}/s"
            f"  {r['bytes'] / 1e6:7.2f} MB"
        )
        if name != "mysqldump":
            line += (
                f"  ({r['dump']['vs_mysqldump']:.2f}x / {r['restore']['vs_mysqldump']:.2f}x "
                f"mysqldump; index backfill {r['backfill']['seconds']:.2f} s)"
            )
        lines.append(line)
    return "\n".join(lines)
