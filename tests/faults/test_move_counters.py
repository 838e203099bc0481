"""A logical shard moved back and forth eight times, with puts, deletes, purges of
tombstones (retention 0) and puts again between the moves: on every server the
entities' auto-increment stays above every ``added_id`` (a new entity's upsert meeting
a copied row's ``(shard, added_id)`` would update that row and write no change row),
every owned shard's feed head stays at or above its largest sequence number, and every
acknowledged put has its change row."""

from __future__ import annotations

import random
from typing import Any

from schemaless import new_id
from schemaless.cleaner.daemon import Cleaner
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import admin


def _invariants(store: Any, acked: list[tuple[bytes, int]]) -> list[str]:
    topo = store.cluster.refresh()
    db = str(topo.owned_db)
    bad = []
    for sid, server in store.cluster.all_servers(topo).items():
        sets = server.run(
            admin(
                [
                    "SELECT AUTO_INCREMENT FROM information_schema.tables WHERE table_schema = %s"
                    " AND table_name = 'entities'",
                    f"SELECT MAX(`added_id`) FROM {quote(db, 'entities')}",
                    f"SELECT h.`shard`, h.`seq`, (SELECT MAX(c.`seq`) FROM {quote(db, 'changes')} c"
                    f" WHERE c.`shard` = h.`shard`) FROM {quote(db, 'changes_head')} h"
                    f" JOIN {quote(db, 'owned')} o ON o.`shard` = h.`shard`",
                ]
            ),
            [db],
        )
        auto, top = sets[0][0][0], sets[1][0][0]
        if top is not None and auto <= top:
            bad.append(f"server {sid}: AUTO_INCREMENT {auto} <= max added_id {top}")
        for shard, head, most in sets[2]:
            if most is not None and most > head:
                bad.append(f"server {sid} shard {shard}: head {head} < max seq {most}")
    seen = {(e.id, e.version) for e in store.changes()}
    for key, version in acked:
        if (key, version) not in seen:
            bad.append(f"put {key.hex()} v{version} has no change")
    return bad


def test_moves_back_and_forth_keep_the_counters_and_every_change(fault_store: Any) -> None:
    store = fault_store(changes=True, shards=4)
    rng = random.Random(5)
    ids = []
    while len(ids) < 40:
        key = new_id()
        if store.cluster.shard_of_id(key) == 1:
            ids.append(key)
    others = [new_id() for _ in range(40)]
    cleaner = Cleaner(store, tombstone_retention=0)
    mover = ShardMover(store, chunk=7)
    acked: list[tuple[bytes, int]] = []
    live: set[bytes] = set()
    for round_ in range(8):
        for _ in range(120):
            key = rng.choice(ids + others[:10])
            if key in live and rng.random() < 0.4:
                store.delete(key)
                live.discard(key)
            else:
                acked.append((key, store.put({"id": key, "r": round_})))
                live.add(key)
            if rng.random() < 0.05:
                cleaner.run_once()
        for key in others[10 + 3 * round_ : 13 + 3 * round_]:  # other shards' inserts
            acked.append((key, store.put({"id": key})))
        cleaner.run_once()
        assert not _invariants(store, acked), _invariants(store, acked)
        mover.move(1, 1 - store.cluster.refresh().shard_servers[1])
        assert not _invariants(store, acked), _invariants(store, acked)
