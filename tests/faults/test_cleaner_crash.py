"""The Cleaner SIGKILLed again and again during a backfill while writers keep writing:
the backfill resumes from its checkpoints and finishes, and the index it leaves is a
superset that one more pass makes exact; no query misses an entity."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from schemaless import ConflictError, DataStore, Index, new_id
from schemaless.cleaner.daemon import Cleaner
from schemaless.cleaner.verify import diff_indexes
from schemaless.local import LocalCluster

from .helpers import wait_for

BY_LINK = Index("by_link", {"link": "str(64)"})
REPO = Path(__file__).resolve().parents[2]


def _cleaner(cluster: LocalCluster, store: DataStore, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "SCHEMALESS_URL": f"mysql://{cluster.addresses[0]}",
        "SCHEMALESS_PREFIX": store.cluster.topology.prefix,
        "SCHEMALESS_OPTION_FILE": str(cluster.option_file),
        "SCHEMALESS_FAILPOINTS": "cleaner.after_batch=sleep(0.05)",
    }
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "schemaless.cleaner.main", "--index", "by_link",
             "--batch", "40"],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def test_cleaner_killed_during_backfill_with_writers(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    store: DataStore = make_store()
    keys = [new_id() for _ in range(1200)]
    store.put_many([{"id": k, "link": f"http://e/{i % 97}", "n": i} for i, k in enumerate(keys)])
    assert store.declare_index(BY_LINK) == "building"
    checkpoints = store.cluster.catalog

    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            key = rng.choice(keys)
            try:
                op = rng.random()
                if op < 0.6:
                    store.put({"id": key, "link": f"http://w/{rng.randrange(50)}", "n": -1})
                elif op < 0.8:
                    store.update(key, lambda e: {**(e or {}), "link": f"http://u/{seed}"})
                else:
                    store.delete(key)
            except ConflictError:
                pass
            except BaseException as exc:
                errors.append(exc)
                return

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in writers:
        t.start()
    log = tmp_path / "cleaner.log"
    rng = random.Random(3)
    try:
        for _ in range(3):
            proc = _cleaner(local_cluster, store, log)
            before = sum(n for *_, n in checkpoints.checkpoints("backfill:by_link").values())

            def progressed(proc: subprocess.Popen[bytes] = proc, before: int = before) -> bool:
                done = checkpoints.checkpoints("backfill:by_link").values()
                return proc.poll() is not None or sum(n for *_, n in done) > before

            wait_for(progressed, timeout=30, what="backfill progress")
            time.sleep(rng.uniform(0, 0.3))
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert store.indexes()["by_link"].state == "building"
        proc = _cleaner(local_cluster, store, log)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        stop.set()
        for t in writers:
            t.join(timeout=30)
    assert not errors, errors
    assert store.cluster.refresh().indexes["by_link"].state == "ready"
    diff = diff_indexes(store)["by_link"]
    assert not diff.missing and not diff.behind, diff.summary()
    live = [e for e in store.get_many(keys) if e is not None]
    for entity in live[:: max(1, len(live) // 60)]:
        assert entity.id in {e.id for e in store.iter(BY_LINK, link=entity["link"])}
    Cleaner(store, fence_after=0).run_once()
    assert diff_indexes(store)["by_link"].clean
