"""A writer process for the crash tests: random writes until a failpoint kills it.

    python tests/faults/writer.py --prefix P --option-file F --log L \\
        [--kill-at NAME:N] [--seed S] [--ops N] HOST:PORT...

Every operation is logged twice to an append-only, fsynced JSON-lines file: a ``begin``
record before it starts (with the bodies it will write) and an ``ack`` record after it
returned.  A crash leaves at most one operation begun and not acknowledged.  Bodies and
ids are logged as JSON with bytes in hex (see ``encode``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
from typing import Any

from schemaless import DataStore, Entity, failpoints

USERS = ["ann", "bob", "cy", "dee"]
TAGS = ["red", "green", "blue", "cyan", "pink"]


def encode(entity: dict[str, Any]) -> dict[str, Any]:
    """An entity as JSON (its id in hex)."""
    return {**entity, "id": entity["id"].hex()}


class Log:
    """Append-only, one fsync per record."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(record) + "\n").encode())
        os.fsync(self.fd)


def kill_on_hit(n: int) -> Any:
    """A failpoint action that SIGKILLs this process on its ``n``-th hit."""
    hits = 0

    def action() -> None:
        nonlocal hits
        hits += 1
        if hits >= n:
            os.kill(os.getpid(), signal.SIGKILL)

    return action


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("servers", nargs="+")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--option-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--kill-at", default=None, help="FAILPOINT:N (SIGKILL on hit N)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", type=int, default=400)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    store = DataStore(args.servers, option_file=args.option_file, prefix=args.prefix, create=False)
    log = Log(args.log)
    if args.kill_at:
        name, _, n = args.kill_at.rpartition(":")
        failpoints.set(name, kill_on_hit(int(n)))

    pool = [rng.randbytes(16) for _ in range(10)]
    versions: dict[bytes, int] = {}

    def body(key: bytes) -> dict[str, Any]:
        return {
            "id": key,
            "user": rng.choice(USERS),
            "n": rng.randrange(5),
            "tags": rng.sample(TAGS, rng.randrange(4)),
            "pad": "x" * rng.randrange(200),
        }

    for seq in range(args.ops):
        op = rng.choice(["put", "put", "cas", "put_many", "update", "delete"])
        key = rng.choice(pool)
        if op == "put":
            entity = body(key)
            log.write({"begin": seq, "op": op, "bodies": [encode(entity)]})
            versions[key] = store.put(entity)
            log.write({"ack": seq, "versions": [versions[key]]})
        elif op == "cas":
            entity = body(key)
            expect = versions.get(key, 0)
            log.write({"begin": seq, "op": op, "bodies": [encode(entity)], "expect": expect})
            versions[key] = store.put(entity, expect_version=expect)
            log.write({"ack": seq, "versions": [versions[key]]})
        elif op == "put_many":
            keys = rng.sample(pool, 3)
            entities = [body(k) for k in keys]
            log.write({"begin": seq, "op": op, "bodies": [encode(e) for e in entities]})
            got = store.put_many(entities)
            versions.update(zip(keys, got, strict=True))
            log.write({"ack": seq, "versions": got})
        elif op == "update":
            new = body(key)

            def change(
                current: Entity | None, new: dict[str, Any] = new, seq: int = seq
            ) -> dict[str, Any]:
                entity = {**new, "count": (current or {}).get("count", 0) + 1}
                log.write({"begin": seq, "op": "update", "bodies": [encode(entity)]})
                return entity

            stored = store.update(key, change)
            versions[key] = stored.version
            log.write({"ack": seq, "versions": [stored.version]})
        else:
            log.write({"begin": seq, "op": op, "ids": [key.hex()]})
            existed = store.delete(key)
            versions.pop(key, None)
            log.write({"ack": seq, "existed": existed})
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
