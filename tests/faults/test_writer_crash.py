"""A writer process SIGKILLed at every step of the write protocol in turn.

The writer logs each operation before it starts and after it returns (append-only,
fsynced).  Afterwards: no acknowledged write is lost, the one operation in flight left
each entity either old or new, no query misses a committed entity, the index is a
superset of what the entities produce, and one Cleaner pass makes it exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import shard_rows

from schemaless import DataStore, Entity, Index
from schemaless.cleaner.daemon import Cleaner
from schemaless.cleaner.verify import diff_indexes
from schemaless.local import LocalCluster

WRITER = Path(__file__).with_name("writer.py")
REPO = Path(__file__).resolve().parents[2]

BY_USER = Index("by_user", {"user": "str(16)", "n": "int"}, shard_on="user")
BY_TAG = Index("by_tag", {"tags": "str(8)"}, multi="tags")

#: (failpoint, the hit on which the writer is killed): late enough that acknowledged
#: writes of every kind come before the crash.
CASES = [
    ("put.before_index_rows", 6),
    ("put.after_index_rows", 6),
    ("put.after_entity", 6),
    ("put.after_stale_rows", 3),
    ("delete.before_entity", 2),
    ("delete.after_entity", 2),
    ("update.before_put", 3),
]

State = dict[str, tuple[dict[str, Any], int] | None]  # id hex -> (body, version) or deleted


def run_writer(
    cluster: LocalCluster, store: DataStore, log: Path, seed: int, **how: str
) -> subprocess.CompletedProcess[bytes]:
    """Run the writer until a failpoint kills it (``kill_at="NAME:N"``, or ``env``)."""
    cmd = [
        sys.executable,
        str(WRITER),
        *cluster.addresses,
        f"--prefix={store.cluster.topology.prefix}",
        f"--option-file={cluster.option_file}",
        f"--log={log}",
        f"--seed={seed}",
    ]
    env = dict(os.environ)
    if "kill_at" in how:
        cmd.append(f"--kill-at={how['kill_at']}")
    if "env" in how:
        env["SCHEMALESS_FAILPOINTS"] = how["env"]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=120, cwd=REPO)


def replay(log: Path) -> tuple[State, dict[str, Any] | None, int]:
    """The state the acknowledged operations left, the operation in flight, and how
    many were acknowledged."""
    state: State = {}
    pending: dict[str, Any] | None = None
    acks = 0
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "begin" in record:
            assert pending is None or pending["begin"] == record["begin"], "two in flight"
            pending = record  # update() may begin again after a conflict
            continue
        assert pending is not None and pending["begin"] == record["ack"], record
        acks += 1
        if pending["op"] == "delete":
            state[pending["ids"][0]] = None
        else:
            for body, version in zip(pending["bodies"], record["versions"], strict=True):
                state[body["id"]] = (body, version)
        pending = None
    return state, pending, acks


def as_entity(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "id": bytes.fromhex(body["id"])}


def check_entities(store: DataStore, state: State, pending: dict[str, Any] | None) -> None:
    """Every acknowledged write is there; the write in flight is either old or new."""
    in_flight: dict[str, dict[str, Any] | None] = {}
    if pending is not None:
        if pending["op"] == "delete":
            in_flight[pending["ids"][0]] = None
        else:
            in_flight.update((b["id"], b) for b in pending["bodies"])
    keys = sorted(set(state) | set(in_flight))
    for key, got in zip(keys, store.get_many(bytes.fromhex(k) for k in keys), strict=True):
        acked = state.get(key)
        old = None if acked is None else as_entity(acked[0])
        if got is not None and acked is not None and got.version == acked[1]:
            assert got == old, f"{key}: the acknowledged body differs"
            continue
        if got is None and acked is None:
            continue  # never written, or deleted (acknowledged or in flight)
        assert key in in_flight, f"{key}: acknowledged {acked}, found {got!r}"
        new = in_flight[key]
        if new is None:
            assert got is None, f"{key}: neither the acknowledged body nor deleted: {got!r}"
        else:
            assert got == as_entity(new), f"{key}: neither old nor new: {got!r}"
            assert acked is None or got.version > acked[1]


def check_queries(store: DataStore) -> list[Entity]:
    """Every live entity is found through every index row it produces."""
    live = [e for e in store.get_many(_all_ids(store)) if e is not None]
    for entity in live:
        found = store.query(BY_USER, user=entity["user"], n=entity["n"], limit=1000)
        assert entity.id in {e.id for e in found}, f"by_user misses {entity!r}"
        for tag in set(entity["tags"]):
            ids = {e.id for e in store.iter(BY_TAG, tags=tag)}
            assert entity.id in ids, f"by_tag {tag!r} misses {entity!r}"
    return live


def _all_ids(store: DataStore) -> list[bytes]:
    topo = store.cluster.refresh()
    return [
        bytes(r[0]) for s in range(topo.n_shards) for r in shard_rows(store, s, "entities", "`id`")
    ]


def check_superset_then_clean(store: DataStore, *, cli: LocalCluster | None = None) -> None:
    """The index holds every row (maybe orphans); one Cleaner pass leaves it exact."""
    for name, diff in diff_indexes(store).items():
        assert not diff.missing, f"{name}: rows missing after the crash: {diff.missing}"
        assert not diff.behind, f"{name}: rows behind after the crash: {diff.behind}"
    if cli is None:
        Cleaner(store, fence_after=0).run_once()  # the writer is dead: nothing in flight
    else:
        env = {**os.environ, "SCHEMALESS_OPTION_FILE": str(cli.option_file)}
        done = subprocess.run(
            [sys.executable, "-m", "schemaless.cleaner.main", "--once", "-q",
             f"--url=mysql://{cli.addresses[0]}", f"--prefix={store.cluster.topology.prefix}",
             "--fence-after=0"],
            env=env, capture_output=True, timeout=120, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
    for name, diff in diff_indexes(store).items():
        assert diff.clean, f"{name} after one Cleaner pass: {diff.summary()}"


@pytest.mark.parametrize(("failpoint", "hit"), CASES, ids=[c[0] for c in CASES])
def test_writer_killed_at_every_step(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path, failpoint: str, hit: int
) -> None:
    store = make_store(indexes=[BY_USER, BY_TAG])
    log = tmp_path / "acks.jsonl"
    seed = CASES.index((failpoint, hit))
    done = run_writer(local_cluster, store, log, seed, kill_at=f"{failpoint}:{hit}")
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    state, pending, acks = replay(log)
    assert pending is not None, "killed between operations: the failpoint was not in one"
    assert acks >= hit - 1, "too few acknowledged writes before the crash"
    check_entities(store, state, pending)
    live = check_queries(store)
    assert live, "nothing to check"
    check_superset_then_clean(store)
    assert check_queries(store) == live  # the Cleaner removed nothing that matters
    store.put({"id": live[0].id, "user": "ann", "n": 1, "tags": []})  # still writable


def test_writer_killed_through_the_environment_then_cleaner_cli(
    make_store: Any, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    """SCHEMALESS_FAILPOINTS names the failpoint (first hit); the Cleaner runs as
    ``cleaner --once`` in its own process."""
    store = make_store(indexes=[BY_USER, BY_TAG])
    log = tmp_path / "acks.jsonl"
    store.put_many(
        [{"id": os.urandom(16), "user": "cy", "n": n, "tags": ["red"]} for n in range(5)]
    )
    done = run_writer(local_cluster, store, log, 99, env="put.after_index_rows=kill")
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    state, pending, _ = replay(log)
    assert pending is not None and pending["op"] in ("put", "cas", "put_many", "update")
    check_entities(store, state, pending)
    check_queries(store)
    check_superset_then_clean(store, cli=local_cluster)
