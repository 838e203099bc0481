"""The unique-index race: 6 writer processes claim 200 usernames at random (new
entities, renames, deletes) while some are SIGKILLed at random moments and a Cleaner
runs; then a brute-force oracle over every stored entity and every operation logged."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from conftest import REPO, assert_clean
from test_unique import BY_NAME, live_by_value, owners

from schemaless import DataStore
from schemaless.cleaner import Cleaner
from schemaless.local import LocalCluster

WORKERS = 6
SECONDS = 8.0
WORKER = Path(__file__).with_name("unique_worker.py")


def spawn(cluster: LocalCluster, store: DataStore, seed: int, seconds: float, log: Path) -> Any:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        # a wider window between the steps, where many of the kills land
        "SCHEMALESS_FAILPOINTS": "put.after_index_rows=sleep(0.01)",
    }
    args = [
        ",".join(cluster.addresses),
        str(cluster.option_file),
        store.cluster.topology.prefix,
        str(seed),
        str(seconds),
        str(log),
    ]
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=env)


def read_logs(paths: list[Path]) -> list[dict[str, Any]]:
    """Every operation, begun (``t1`` None if it never ended: its outcome is unknown)."""
    ops: list[dict[str, Any]] = []
    for path in paths:
        if not path.exists():  # killed before it began
            continue
        begun: dict[str, Any] | None = None
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "t0" in rec:
                begun = {**rec, "t1": None, "res": None}
                ops.append(begun)
            else:
                assert begun is not None and begun["id"] == rec["id"]
                begun.update(t1=rec["t1"], res=rec["res"])
    return ops


def allowed_states(ops: list[dict[str, Any]]) -> dict[str, set[str | None]]:
    """For each entity, the names it may have now (None: absent or deleted)."""
    states: dict[str, set[str | None]] = {}
    for op in ops:  # the operations of one entity run in one process, in order
        now = states.setdefault(op["id"], {None})
        after = op["name"] if op["op"] != "delete" else None
        if op["res"] == "ok":
            states[op["id"]] = {after}
        elif op["res"] is None:  # killed, or failed in flight: either
            now.add(after)
    return states


def test_six_processes_race_for_200_usernames(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    store = make_store([BY_NAME])
    rnd = random.Random(os.getpid())
    stop = threading.Event()
    cleaner = Cleaner(store, fence_after=1.0)
    passes = [0]

    def clean() -> None:
        while not stop.is_set():
            cleaner.run_once()
            passes[0] += 1
            stop.wait(0.2)

    sweeper = threading.Thread(target=clean)
    sweeper.start()
    logs: list[Path] = []
    procs: list[Any] = []
    start = time.monotonic()
    kills = 0
    try:
        for i in range(WORKERS):
            logs.append(tmp_path / f"w{i}.log")
            procs.append(spawn(local_cluster, store, i, SECONDS, logs[-1]))
        while time.monotonic() - start < SECONDS - 1:
            time.sleep(rnd.uniform(0.3, 0.9))
            victim = rnd.randrange(WORKERS)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            kills += 1
            logs.append(tmp_path / f"w{len(logs)}.log")
            left = SECONDS - (time.monotonic() - start)
            procs[victim] = spawn(local_cluster, store, len(logs), max(left, 1.0), logs[-1])
        for p in procs:
            assert p.wait(120) in (0, -signal.SIGKILL)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        stop.set()
        sweeper.join()
    ops = read_logs(logs)
    done = [op for op in ops if op["res"] is not None]
    assert kills >= 5 and passes[0] >= 2
    assert sum(op["res"] == "ok" for op in done) > 200
    assert sum(op["res"] == "violation" for op in done) > 20

    # no two live entities share a value, and the unique row names the live one
    live = live_by_value(store)
    assert {name: ids for name, ids in live.items() if len(ids) > 1} == {}
    rows = owners(store)
    for name, ids in live.items():
        assert rows[(name,)] == ids[0]

    # every acknowledged claim holds (an operation cut short may or may not have)
    actual: dict[str, str | None] = {ids[0].hex(): name for name, ids in live.items()}
    for key, allowed in allowed_states(ops).items():
        assert actual.get(key) in allowed, (key, actual.get(key), allowed)

    # every violation met an owner that was (or may have been) live at the time
    holders: dict[str, list[tuple[float, float]]] = {}
    by_entity: dict[str, list[dict[str, Any]]] = {}
    for op in ops:
        by_entity.setdefault(op["id"], []).append(op)
    for history in by_entity.values():
        for n, op in enumerate(history):
            if op["op"] == "delete" or op["res"] not in ("ok", None):
                continue
            ends = [o["t1"] for o in history[n + 1 :] if o["res"] == "ok"]
            holders.setdefault(op["name"], []).append((op["t0"], ends[0] if ends else 1e18))
    for op in done:
        if op["res"] == "violation":
            spans = holders.get(op["name"], [])
            assert any(t0 <= op["t1"] and op["t0"] <= t1 for t0, t1 in spans), op

    # no value stays unclaimable once its owner is deleted and the Cleaner passed
    store.delete_many(ids[0] for ids in live.values())
    store.flush()
    Cleaner(store).run_once()
    assert_clean(store)
    assert owners(store) == {}
    fresh = [{"name": f"user{i}"} for i in range(200)]
    store.put_many(fresh)
    assert all(store.get_by("by_name", name=e["name"])["id"] == e["id"] for e in fresh)
