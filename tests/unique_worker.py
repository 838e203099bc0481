"""A writer process of the unique-index race test (tests/test_unique_race.py): claims
random usernames with new entities, renames and deletes, logging every operation
(one JSON line when it begins, one when it ends) so the test's oracle can judge it.

Usage: python unique_worker.py ADDRESSES OPTION_FILE PREFIX SEED SECONDS LOG
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from schemaless import ConflictError, DataStore, UniqueViolation
from schemaless.ids import new_id

NAMES = 200


def main(
    addresses: str, option_file: str, prefix: str, seed: int, seconds: float, log: str
) -> None:
    rnd = random.Random(seed)
    store = DataStore(
        addresses.split(","), option_file=option_file, prefix=prefix, create=False, claim_wait=0.1
    )
    mine: list[bytes] = []
    deadline = time.monotonic() + seconds
    with open(log, "a", buffering=1) as out:

        def note(**fields: Any) -> None:
            out.write(json.dumps(fields) + "\n")

        while time.monotonic() < deadline:
            name = f"user{rnd.randrange(NAMES)}"
            r = rnd.random()
            if not mine or (r < 0.45 and len(mine) < 20):
                key, op = new_id(), "new"
            elif r < 0.9:
                key, op = rnd.choice(mine), "rename"
            else:
                key, op, name = rnd.choice(mine), "delete", ""
            note(op=op, id=key.hex(), name=name, t0=time.time())
            try:
                if op == "new":
                    store.put({"id": key, "name": name}, expect_version=0)
                    mine.append(key)
                elif op == "rename":
                    store.update(key, lambda e, name=name: {**(e or {}), "name": name})
                else:
                    store.delete(key)
                    mine.remove(key)
                res = "ok"
            except UniqueViolation:
                res = "violation"
            except ConflictError:
                res = "conflict"
            note(op=op, id=key.hex(), name=name, res=res, t1=time.time())
    store.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], int(a[3]), float(a[4]), a[5])
