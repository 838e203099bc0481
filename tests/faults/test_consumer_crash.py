"""A change feed consumer SIGKILLed at random moments while writers put, update and
delete, a logical shard moves back and forth and the Cleaner trims the feed and purges
tombstones: it sees every acknowledged write
(puts by their version, deletes between the versions around them), each entity's
versions in increasing order within a run, and a restart resumes after what it
acknowledged, never before."""

from __future__ import annotations

import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import wait_until

from schemaless import DataStore, failpoints, new_id
from schemaless.cleaner.daemon import Cleaner
from schemaless.local import LocalCluster
from schemaless.move import ShardMover

from .feeddiag import explain

CONSUMER = Path(__file__).with_name("consumer.py")
REPO = Path(__file__).resolve().parents[2]


def start(cluster: LocalCluster, store: DataStore, log: Path, seed: int, idle: bool) -> Any:
    cmd = [
        sys.executable,
        str(CONSUMER),
        *cluster.addresses,
        f"--prefix={store.cluster.topology.prefix}",
        f"--option-file={cluster.option_file}",
        f"--log={log}",
        "--name=crashy",
        f"--seed={seed}",
    ]
    if idle:
        cmd.append("--until-idle")
    return subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE)


def writer(store: DataStore, ids: list[bytes], seed: int, stop: threading.Event) -> list[Any]:
    """Random puts, updates and deletes of its own ids; the acknowledged operations:
    ``(id, "put", version, t)`` and ``(id, "delete", version before, t)`` (``t``: when,
    for a failure's diagnosis)."""
    rng = random.Random(seed)
    done: list[Any] = []
    current: dict[bytes, int] = {}
    while not stop.is_set():
        key = rng.choice(ids)
        op = rng.random()
        if op < 0.55:
            done.append((key, "put", store.put({"id": key, "n": rng.randrange(100)}), time.time()))
        elif op < 0.8 and key in current:
            got = store.update(key, lambda e, key=key: {**(e or {"id": key}), "n": 1})
            done.append((key, "put", got.version, time.time()))
        elif key in current:
            store.delete(key)
            done.append((key, "delete", current.pop(key), time.time()))
            continue
        else:
            continue
        current[key] = done[-1][2]
    return done


def test_a_killed_consumer_misses_nothing(
    fault_cluster: LocalCluster, fault_store: Callable[..., DataStore], tmp_path: Path
) -> None:
    store = fault_store(changes=True, shards=4)
    log = tmp_path / "consumer.jsonl"
    rng = random.Random(11)
    ids = [[new_id() for _ in range(12)] for _ in range(2)]
    stop = threading.Event()
    results: list[list[Any]] = [[], []]

    def write(i: int) -> None:
        results[i] = writer(store, ids[i], i, stop)

    moved: list[int] = []
    timeline: list[tuple[float, str]] = []  # for a failure's diagnosis
    for point in ("move.after_copy", "move.after_fence", "move.before_verify", "move.after_owned"):
        failpoints.set(point, lambda point=point: timeline.append((time.time(), point)))

    def move() -> None:
        mover = ShardMover(store)
        for _ in range(2):
            time.sleep(0.5)
            topo = store.cluster.refresh()
            timeline.append((time.time(), f"move of shard 1 from server {topo.shard_servers[1]}"))
            report = mover.move(1, 1 - topo.shard_servers[1])
            done = f"pause {report.pause_seconds:.3f}s, map v{store.cluster.refresh().map_version}"
            timeline.append((time.time(), f"moved shard 1 to {report.target}, {done}"))
            moved.append(1)

    trimmed: list[int] = []

    def clean() -> None:  # trims what the consumer acknowledged, purges tombstones
        with DataStore(
            fault_cluster.addresses,
            option_file=str(fault_cluster.option_file),
            prefix=store.cluster.topology.prefix,
            create=False,
        ) as ds:
            cleaner = Cleaner(ds, tombstone_retention=0)
            before = (0, 0)
            while not stop.is_set():
                figures = cleaner.run_once()
                trimmed.append(figures["feed_trimmed"])
                now = (figures["feed_trimmed"], figures["purged"])  # since the Cleaner began
                if now != before:
                    cut = f"{now[0] - before[0]} change rows, {now[1] - before[1]} tombstones"
                    timeline.append((time.time(), f"the Cleaner deleted {cut}"))
                    before = now
                time.sleep(0.2)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    threads += [threading.Thread(target=move), threading.Thread(target=clean)]
    for t in threads:
        t.start()
    kills = 0
    try:
        for n in range(8):
            size = log.stat().st_size if log.exists() else 0
            proc = start(fault_cluster, store, log, n, idle=False)
            timeline.append((time.time(), f"consumer {proc.pid} started"))
            # killed at a random moment once it is reading (its start-up is slow under load)
            wait_until(lambda size=size: log.exists() and log.stat().st_size > size, timeout=60)
            time.sleep(rng.uniform(0, 0.6))
            proc.send_signal(signal.SIGKILL)
            timeline.append((time.time(), f"consumer {proc.pid} killed"))
            proc.wait(10)
            kills += proc.returncode == -signal.SIGKILL
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert kills == 8
    assert moved == [1, 1]
    assert sum(trimmed) > 0  # acknowledged rows were trimmed meanwhile
    assert all(len(ops) > 20 for ops in results)
    last = start(fault_cluster, store, log, 99, idle=True)
    _, err = last.communicate(timeout=60)
    assert last.returncode == 0, err.decode()
    timeline.append((time.time(), f"consumer {last.pid} ran until idle"))
    check(log, [op for ops in results for op in ops], store, timeline)


def logged(log: Path) -> list[Any]:
    """The log's records.  A SIGKILL can cut a record's write short (the kernel stops a
    write between pages for a fatal signal), and the next run's first record then
    follows it on the same line: the torn one is dropped.  Nothing was acknowledged
    after it (the run died writing it), so the next run delivers it again."""
    text = log.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()  # the last run died writing it and no run wrote after it
    return [json.loads(line[max(0, line.rfind('{"run": ')) :]) for line in lines]


def check(log: Path, acked: list[Any], store: DataStore, timeline: list[tuple[float, str]]) -> None:
    events: dict[str, list[Any]] = {}  # id -> (run, version, deleted)
    runs: list[int] = []
    acks: dict[int, dict[str, int]] = {}  # run -> the positions it last logged as acked
    first_seq: dict[int, dict[int, int]] = {}  # run -> shard -> its first event's seq
    records = logged(log)
    for r in records:
        if r["run"] not in runs:
            runs.append(r["run"])
        if "ack" in r:
            acks[r["run"]] = r["ack"]
            continue
        events.setdefault(r["id"], []).append((r["run"], r["v"], r["del"]))
        first_seq.setdefault(r["run"], {}).setdefault(r["shard"], r["seq"])
    # within a run, each entity's versions only grow
    for key, seen in events.items():
        by_run: dict[int, list[int]] = {}
        for run, version, _ in seen:
            by_run.setdefault(run, []).append(version)
        for versions in by_run.values():
            assert versions == sorted(set(versions)), f"{key}: {versions}"
    # every acknowledged write was seen: puts by version, deletes after the version before
    missing = [w for w in acked if not was_seen(events.get(w[0].hex(), []), w[1], w[2])]
    assert not missing, explain(missing, acked, records, store, timeline)
    # the final state is the stored one
    for key in {write[0] for write in acked}:
        stored = store.get(key)
        final = events[key.hex()][-1]
        if stored is None:
            assert final[2], key.hex()
        else:
            assert (final[1], final[2]) == (stored.version, False), key.hex()
    # a restart resumes after what the previous run acknowledged (never before it)
    for before, after in itertools.pairwise(runs):
        for shard, position in acks.get(before, {}).items():
            first = first_seq.get(after, {}).get(int(shard))
            if isinstance(position, int) and first is not None:
                assert first > position, (shard, position, first)
    assert len(runs) >= 8  # every killed run read something first


def was_seen(events: list[Any], op: str, version: int) -> bool:
    """Whether a consumer saw an acknowledged write among a key's ``(run, version,
    deleted)`` events: a put by its version, a delete after the version before it."""
    if op == "put":
        return any(v == version and not d for _, v, d in events)
    return any(v > version and d for _, v, d in events)
