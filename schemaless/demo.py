"""The demo: a local cluster, a datastore, a few thousand FriendFeed-like entries.

Run with ``make demo`` (or ``python -m schemaless.demo``).  It starts (or finds) the
local cluster, stores entries, reads them back by id and in batches, queries an
index, and prints where the data went and how long each step took.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .ids import id_hex, new_id
from .index import Index
from .local import LocalCluster
from .names import quote
from .scatter import bare, shard_is, shard_unions
from .store import DataStore

__all__ = ["main"]

WORDS = (
    "we just launched a new backend system for friendfeed schemaless mysql index "
    "cleaner shard entity feed photo link comment like share"
).split()


def entry(user: bytes, feed: bytes, published: int) -> dict[str, Any]:
    """One FriendFeed-like entry, as in the 2009 post."""
    entity_id = new_id()
    return {
        "id": entity_id,
        "user_id": user,
        "feed_id": feed,
        "title": " ".join(random.choices(WORDS, k=8)).capitalize(),
        "link": f"http://friendfeed.com/e/{id_hex(entity_id)}",
        "published": published,
        "updated": published,
    }


@contextmanager
def step(what: str) -> Iterator[Callable[[str], None]]:
    """Time a step and print one line about it."""
    started = time.perf_counter()
    notes: list[str] = []
    yield notes.append
    ms = (time.perf_counter() - started) * 1000
    print(f"  {what:<48} {ms:9.1f} ms  {' '.join(notes)}")


def _where_the_data_went(store: DataStore) -> None:
    """How many entities each server and logical shard holds."""
    print("where the data went")
    topo = store.cluster.current()
    unions = shard_unions(
        topo,
        lambda s: (
            f"SELECT COUNT(*) FROM {quote(topo.dbs[s], 'entities')} WHERE {shard_is(topo, s)}TRUE"
        ),
    )
    found = store.cluster.scatter(topo, unions, bare).results
    for sid, server in store.cluster.all_servers(topo).items():
        counts = [int(r[0]) for r in found.get(sid, [[]])[0]]
        print(
            f"  server {sid} {server.name}: {len(counts)} logical shards, "
            f"{sum(counts)} entities (per shard: {', '.join(map(str, counts))})"
        )


def main(argv: list[str] | None = None) -> None:
    """Run the demo."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=5000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--dir", default=os.environ.get("SCHEMALESS_LOCAL_DIR"))
    parser.add_argument("--prefix", default="demo")
    args = parser.parse_args(argv)

    print("schemaless demo")
    with step("local cluster up (2 mariadbd)") as note:
        cluster = LocalCluster(args.dir).up()
        note(", ".join(cluster.addresses))
    by_user = Index(table="index_user_id", properties=["user_id"], shard_on="user_id")
    with step(f"open datastore ({args.shards} logical shards)") as note:
        store = DataStore(
            mysql_shards=cluster.addresses,
            indexes=[by_user],
            option_file=str(cluster.option_file),
            prefix=args.prefix,
            shards=args.shards,
        )
        note(repr(store))
    users = [new_id() for _ in range(args.users)]
    feeds = {u: new_id() for u in users}
    now = int(time.time())
    entries = [
        entry(u, feeds[u], now - random.randrange(86400))
        for u in random.choices(users, k=args.entries)
    ]
    with step(f"put_many {len(entries)} entries (batches of 500)") as note:
        for n in range(0, len(entries), 500):
            store.put_many(entries[n : n + 500])
        note(f"{len(entries)} entities, each with its index_user_id row")
    sample = random.sample(entries, 100)
    with step("get 100 entries one by one") as note:
        assert all(store.get(e["id"]) == e for e in sample)
        note("all equal to what was put")
    with step("get_many 1000 entries (one statement per server)") as note:
        batch = random.sample(entries, min(1000, len(entries)))
        got = store.get_many(e["id"] for e in batch)
        assert got == batch
        note(f"{len(got)} found")
    user = users[0]
    with step("index_user_id.get_all(user_id=...)") as note:
        found = by_user.get_all(store, user_id=user)
        note(f"{len(found)} entries of user {id_hex(user)[:8]}")
    with step("query: a user's 10 newest, by index order") as note:
        page = store.query("user_id", user_id=user, limit=10, order="desc")
        note(f"{len(page)} entries, cursor for more: {page.cursor is not None}")

    _where_the_data_went(store)
    where = "" if args.dir is None else f", local_dir={args.dir!r}"
    print(
        f"the datastore {args.prefix!r} stays in the local cluster: open it from Python with "
        f"DataStore.from_env(prefix={args.prefix!r}{where}); "
        "stop the servers with `schemaless local down`"
    )
    store.close()


if __name__ == "__main__":
    main()
