"""A change feed consumer for the crash tests: a subscription read and acknowledged
until SIGKILL (or, with ``--until-idle``, until caught up).

    python tests/faults/consumer.py --prefix P --option-file F --log L --name N \\
        [--seed S] [--until-idle] HOST:PORT...

Every event is logged (``{"run", "id", "v", "del", "shard", "seq"}``, with ``t``, the
time, and ``at``, the server its shard has on the consumer's map and the map's version,
for a failure's diagnosis) before it is acknowledged, and every acknowledgement after
it returned (``{"run", "ack": positions, "t"}``), to an append-only JSON-lines file (a
SIGKILL loses nothing written to it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from schemaless import DataStore


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("servers", nargs="+")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--option-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--until-idle", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    run = os.getpid()

    def log(record: dict[str, object]) -> None:
        os.write(fd, (json.dumps({"run": run, **record, "t": time.time()}) + "\n").encode())

    store = DataStore(args.servers, option_file=args.option_file, prefix=args.prefix, create=False)
    sub = store.subscribe(args.name)
    every = rng.randint(1, 5)
    last = None
    for seen, event in enumerate(sub.changes(follow=not args.until_idle), 1):
        topo = store.cluster.topology
        log(
            {
                "id": event.id.hex(),
                "v": event.version,
                "del": event.deleted,
                "shard": event.shard,
                "seq": event.seq,
                "at": [str(topo.servers[topo.shard_servers[event.shard]]), topo.map_version],
            }
        )
        last = event
        if seen % every == 0:
            sub.ack(event)
            log({"ack": {str(s): p for s, p in event.positions.items()}})
    if last is not None:
        sub.ack(last)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
