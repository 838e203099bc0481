"""A put whose guard (the key's check for a new entity, the update trigger for a
present one) queues behind a fence that waits for another holder of the ``owned`` row:
refused once the fence commits, nothing written (no entity, no change row, the feed's
head unchanged)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from conftest import wait_until

from schemaless import new_id
from schemaless.errors import TableMissing
from schemaless.names import quote
from schemaless.owned import admin, disown_sql

_RUNNING = (  # another connection's statement (this one's text matches itself)
    "SELECT COUNT(*) FROM information_schema.processlist"
    " WHERE info LIKE %s AND id <> CONNECTION_ID()"
)


@pytest.mark.parametrize("present", [False, True])
def test_a_put_queued_behind_a_waiting_fence_writes_nothing(
    fault_store: Any, present: bool
) -> None:
    store = fault_store(changes=True, shards=4, move_wait=0.3)
    key = new_id()
    while store.cluster.shard_of_id(key) != 1:
        key = new_id()
    if present:
        store.put({"id": key, "n": 0})
    topo = store.cluster.refresh()
    db = str(topo.owned_db)
    server = store.cluster.server_of_shard(topo, 1)
    owned, head = quote(db, "owned"), quote(db, "changes_head")
    before = server.run(admin([f"SELECT `seq` FROM {head} WHERE `shard` = 1"]))[0][0][0]
    hold = [
        "START TRANSACTION",
        f"SELECT COUNT(*) FROM {owned} WHERE `shard` = 1 LOCK IN SHARE MODE",
        "DO SLEEP(0.9)",  # below the fault stores' 1 s read timeout
        "COMMIT",
    ]
    done: list[str] = []
    holder = threading.Thread(target=lambda: done.append(str(server.run(admin(hold)))))
    fence = threading.Thread(
        target=lambda: done.append(str(server.run(admin([disown_sql(db, 1)]))))
    )
    holder.start()
    # the holder in its sleep, the owned row held; then the fence waits for it
    wait_until(lambda: server.run(_RUNNING, ["%SLEEP%"])[0][0][0])
    fence.start()
    wait_until(lambda: server.run(_RUNNING, ["%DELETE FROM%owned%"])[0][0][0])
    started = time.monotonic()
    with pytest.raises(TableMissing):
        store.put({"id": key, "n": 1}, timeout=10)
    waited = time.monotonic() - started
    holder.join()
    fence.join()
    rows = server.run(
        admin(
            [
                f"SELECT `version` FROM {quote(db, 'entities')} WHERE `id` = %s",
                f"SELECT COUNT(*) FROM {quote(db, 'changes')} WHERE `id` = %s",
                f"SELECT `seq` FROM {head} WHERE `shard` = 1",
            ]
        ),
        [key, key],
    )
    assert waited > 0.2, waited  # it queued behind the fence
    assert len(rows[0]) == int(present)
    assert rows[1][0][0] == int(present)
    assert rows[2][0][0] == before
    assert len(done) == 2, done  # the holder committed, the fence too
