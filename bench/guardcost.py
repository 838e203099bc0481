"""``python -m bench.guardcost``: the servers' CPU and latency of each guard shape,
statement by statement (issue 39, step 1's profile).

One connection sends each shape ``--n`` times (autocommit, one statement per round
trip), the shapes interleaved in rounds: today's statement on a shard's own table, the
same on one table per server with no guard, and the guarded shapes of
``bench.ownedsql`` (and the alternatives tried).  Run on a local cluster (``--dir``;
the server's CPU from ``/proc``).  Example: ``python -m bench.guardcost --n 2000``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from schemaless.local import LocalCluster

from .env import RawClient, Servers
from .layout import _cpu_seconds

__all__ = ["SHAPES", "main"]

DB = "guardcost"
T, ONE, OWNED = f"`{DB}`.`today`", f"`{DB}`.`one`", f"`{DB}`.`owned`"
TRIG = f"`{DB}`.`trig`"  # one table per server, guarded by triggers
BARE = f"`{DB}`.`bare`"  # the same with triggers that read nothing (their own cost)
# clustered on id as the library's entities, `u` as their `updated` with its index: the
# update trigger (today's), the key's check through that index (declared unique and first,
# so InnoDB checks the key on the entry every update rewrites), and no guard
UPD = {name: f"`{DB}`.`upd_{name}`" for name in ("trigger", "key", "none")}
_LOCK = f" FROM {OWNED} WHERE {OWNED}.`shard` = 3 LOCK IN SHARE MODE"
_KEY = ", FOREIGN KEY (`shard`) REFERENCES `owned` (`shard`)"

#: name -> (SQL, parameters of call k): inserts of new rows, then updates of row k
SHAPES: dict[str, tuple[str, Callable[[int], list[Any]]]] = {
    "insert, today": (f"INSERT INTO {T} (`id`, `v`) VALUES (%s, 1)", lambda k: [k]),
    "insert, no guard": (
        f"INSERT INTO {ONE} (`shard`, `id`, `v`) VALUES (3, %s, 1)",
        lambda k: [k],
    ),
    "insert ... select, locked (row)": (
        f"INSERT INTO {ONE} (`shard`, `id`, `v`) SELECT {OWNED}.`shard`, %s, 1{_LOCK}",
        lambda k: [k],
    ),
    "insert ... select, unlocked": (
        f"INSERT INTO {ONE} (`shard`, `id`, `v`) SELECT {OWNED}.`shard`, %s, 1"
        f" FROM {OWNED} WHERE {OWNED}.`shard` = 3",
        lambda k: [k],
    ),
    "insert values (subquery)": (
        f"INSERT INTO {ONE} (`shard`, `id`, `v`) VALUES ((SELECT `shard` FROM {OWNED}"
        " WHERE `shard` = 3 LOCK IN SHARE MODE), %s, 1)",
        lambda k: [k],
    ),
    "insert, trigger-guarded": (
        f"INSERT INTO {TRIG} (`shard`, `id`, `v`) VALUES (3, %s, 1)",
        lambda k: [k],
    ),
    "update, today": (f"UPDATE {T} SET `v` = `v` + 1 WHERE `id` = %s", lambda k: [k]),
    "update, no guard": (f"UPDATE {ONE} SET `v` = `v` + 1 WHERE `id` = %s", lambda k: [k]),
    "update join owned (row)": (
        f"UPDATE {ONE} JOIN {OWNED} ON {OWNED}.`shard` = {ONE}.`shard` AND {OWNED}.`shard` = 3"
        f" SET `v` = `v` + 1 WHERE {ONE}.`id` = %s",
        lambda k: [k],
    ),
    "update where shard in (locked select)": (
        f"UPDATE {ONE} SET `v` = `v` + 1 WHERE `id` = %s AND `shard` IN (SELECT `shard`{_LOCK})",
        lambda k: [k],
    ),
    "update, trigger-guarded": (
        f"UPDATE {TRIG} SET `v` = `v` + 1 WHERE `id` = %s",
        lambda k: [k],
    ),
    "update, trigger that reads nothing": (
        f"UPDATE {BARE} SET `v` = `v` + 1 WHERE `id` = %s",
        lambda k: [k],
    ),
    "upsert of a stored row, trigger-guarded": (
        f"INSERT INTO {TRIG} (`shard`, `id`, `v`) VALUES (3, %s, 1)"
        " ON DUPLICATE KEY UPDATE `v` = `v` + 1",
        lambda k: [k],
    ),
    "upsert of a stored row, no guard": (
        f"INSERT INTO {ONE} (`shard`, `id`, `v`) VALUES (3, %s, 1)"
        " ON DUPLICATE KEY UPDATE `v` = `v` + 1",
        lambda k: [k],
    ),
    "count, locked (head's read)": (
        f"SELECT COUNT(*) FROM {OWNED} WHERE `shard` IN (3) LOCK IN SHARE MODE",
        lambda k: [],
    ),
    "head check (compound)": (
        f"BEGIN NOT ATOMIC IF (SELECT COUNT(*) FROM {OWNED} WHERE `shard` IN (3)"
        " LOCK IN SHARE MODE) < 1 THEN SIGNAL SQLSTATE '45000'; END IF; END",
        lambda k: [],
    ),
    "select 1 (a round trip)": ("SELECT 1", lambda k: []),
    # an update that moves `updated` (every write of an entity does): the guard of changed
    # rows today (the trigger), a key checked on the index of `updated`, none
    **{
        f"update + updated, {how}": (
            f"UPDATE {UPD[name]} SET `v` = `v` + 1, `u` = `u` + 1 WHERE `id` = %s",
            lambda k: [k],
        )
        for name, how in (
            ("trigger", "trigger-guarded"),
            ("key", "the key through by_updated"),
            ("none", "no guard"),
        )
    },
    # step 3's check (schemaless.owned.check_sql) after a read, and its alternatives
    "get, today": (f"SELECT `v` FROM {T} WHERE `id` = %s", lambda k: [k]),
    "get, one table": (f"SELECT `v` FROM {ONE} WHERE `id` = %s", lambda k: [k]),
    "get + check (compound, step 3)": (
        f"SELECT `v` FROM {ONE} WHERE `id` = %s; BEGIN NOT ATOMIC IF (SELECT COUNT(*) FROM"
        f" {OWNED} WHERE `shard` IN (3)) < 1 THEN SIGNAL SQLSTATE '45000'; END IF; END",
        lambda k: [k],
    ),
    "get + count (client checks)": (
        f"SELECT `v` FROM {ONE} WHERE `id` = %s; SELECT COUNT(*) FROM {OWNED} WHERE `shard` IN (3)",
        lambda k: [k],
    ),
    "get, left join from owned": (
        f"SELECT o.`shard`, e.`v` FROM {OWNED} o LEFT JOIN {ONE} e ON e.`id` = %s"
        " WHERE o.`shard` = 3",
        lambda k: [k],
    ),
    "get union all count": (
        f"SELECT `v` FROM {ONE} WHERE `id` = %s UNION ALL SELECT COUNT(*) FROM {OWNED}"
        " WHERE `shard` IN (3)",
        lambda k: [k],
    ),
    # a delete's or compare-and-set's batch (issue 39's single-write target) and its
    # alternatives: the transaction alone, the locked count first (the client checks)
    "update, trigger, txn": (
        f"START TRANSACTION; UPDATE {TRIG} SET `v` = `v` + 1 WHERE `id` = %s; COMMIT",
        lambda k: [k],
    ),
    "update, trigger, txn + locked count first": (
        f"START TRANSACTION; SELECT COUNT(*) FROM {OWNED} WHERE `shard` IN (3)"
        f" LOCK IN SHARE MODE; UPDATE {TRIG} SET `v` = `v` + 1 WHERE `id` = %s; COMMIT",
        lambda k: [k],
    ),
    "update, trigger, txn + locked check first": (
        f"START TRANSACTION; BEGIN NOT ATOMIC IF (SELECT COUNT(*) FROM {OWNED} WHERE `shard`"
        " IN (3) LOCK IN SHARE MODE) < 1 THEN SIGNAL SQLSTATE '45000'; END IF; END;"
        f" UPDATE {TRIG} SET `v` = `v` + 1 WHERE `id` = %s; COMMIT",
        lambda k: [k],
    ),
    # with an index, a delete reads the old body first, in the same transaction
    "read + update, today, txn": (
        f"START TRANSACTION; SELECT `v` FROM {T} WHERE `id` = %s;"
        f" UPDATE {T} SET `v` = `v` + 1 WHERE `id` = %s; COMMIT",
        lambda k: [k, k],
    ),
    "read + update, trigger, txn (tentative)": (
        f"START TRANSACTION; SELECT `v` FROM {TRIG} WHERE `id` = %s;"
        f" UPDATE {TRIG} SET `v` = `v` + 1 WHERE `id` = %s; COMMIT",
        lambda k: [k, k],
    ),
    "read + update, trigger, txn + check before COMMIT": (
        f"START TRANSACTION; SELECT `v` FROM {TRIG} WHERE `id` = %s;"
        f" UPDATE {TRIG} SET `v` = `v` + 1 WHERE `id` = %s; BEGIN NOT ATOMIC IF (SELECT"
        f" COUNT(*) FROM {OWNED} WHERE `shard` IN (3)) < 1 THEN SIGNAL SQLSTATE '45000';"
        " END IF; END; COMMIT",
        lambda k: [k, k],
    ),
    "update, trigger, txn + check (step 3)": (
        f"START TRANSACTION; UPDATE {TRIG} SET `v` = `v` + 1 WHERE `id` = %s;"
        f" BEGIN NOT ATOMIC IF (SELECT COUNT(*) FROM {OWNED} WHERE `shard` IN (3)) < 1 THEN"
        " SIGNAL SQLSTATE '45000'; END IF; END; COMMIT",
        lambda k: [k],
    ),
}

DDL = [
    f"DROP DATABASE IF EXISTS `{DB}`",
    f"CREATE DATABASE `{DB}`",
    f"CREATE TABLE {T} (`added_id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,"
    " `id` BIGINT NOT NULL, `v` BIGINT NOT NULL, UNIQUE KEY `by_id` (`id`))",
    f"CREATE TABLE {ONE} (`shard` SMALLINT UNSIGNED NOT NULL, `added_id` BIGINT UNSIGNED NOT"
    " NULL AUTO_INCREMENT, `id` BIGINT NOT NULL, `v` BIGINT NOT NULL,"
    " PRIMARY KEY (`shard`, `added_id`), KEY `added` (`added_id`), UNIQUE KEY `by_id` (`id`))",
    f"CREATE TABLE {TRIG} LIKE {ONE}",
    f"CREATE TABLE {BARE} LIKE {ONE}",
    *(
        f"CREATE TRIGGER `{DB}`.`bare_{when}` BEFORE {when} ON {BARE} FOR EACH ROW"
        " IF NEW.`shard` IS NULL THEN SIGNAL SQLSTATE '45000'; END IF"
        for when in ("INSERT", "UPDATE")
    ),
    f"CREATE TABLE {OWNED} (`shard` SMALLINT UNSIGNED NOT NULL PRIMARY KEY)",
    *(
        f"CREATE TRIGGER `{DB}`.`trig_{when}` BEFORE {when} ON {TRIG} FOR EACH ROW"
        f" IF NOT EXISTS (SELECT 1 FROM {OWNED} WHERE `shard` = NEW.`shard`"
        " LOCK IN SHARE MODE) THEN SIGNAL SQLSTATE '45000'; END IF"
        for when in ("INSERT", "UPDATE")
    ),
    f"INSERT INTO {OWNED} VALUES (1), (2), (3), (4)",
    *(
        f"CREATE TABLE {UPD[name]} (`shard` SMALLINT UNSIGNED NOT NULL, `added_id` BIGINT"
        " UNSIGNED NOT NULL AUTO_INCREMENT, `id` BIGINT NOT NULL, `v` BIGINT NOT NULL,"
        f" `u` BIGINT NOT NULL, PRIMARY KEY (`id`), {first}"
        " UNIQUE KEY `by_shard_added` (`shard`, `added_id`), KEY `added` (`added_id`)"
        f"{after}{key})"
        for name, first, after, key in (
            ("trigger", "", ", KEY `by_updated` (`shard`, `u`, `added_id`)", _KEY),
            ("key", "UNIQUE KEY `by_updated` (`shard`, `u`, `added_id`),", "", _KEY),
            ("none", "", ", KEY `by_updated` (`shard`, `u`, `added_id`)", ""),
        )
    ),
    f"CREATE TRIGGER `{DB}`.`upd_trigger_update` BEFORE UPDATE ON {UPD['trigger']} FOR EACH ROW"
    f" IF NOT EXISTS (SELECT 1 FROM {OWNED} WHERE `shard` = NEW.`shard`"
    " LOCK IN SHARE MODE) THEN SIGNAL SQLSTATE '45000'; END IF",
]


def measure(raw: RawClient, pids: Sequence[int], n: int, rounds: int) -> dict[str, Any]:
    """Per shape: median latency (µs) and the server's CPU per statement (µs)."""
    lat: dict[str, list[float]] = {name: [] for name in SHAPES}
    cpu = dict.fromkeys(SHAPES, 0.0)
    step = n // rounds
    for r in range(rounds):
        for i, (name, (sql, params)) in enumerate(SHAPES.items()):
            base = (1 + i) * 10**7 + r * step if name.startswith("insert") else 0
            c0 = _cpu_seconds(pids)
            for j in range(step):  # inserts: new ids; updates: the preloaded rows
                t = time.perf_counter()
                raw.run(0, sql, params(base + j))
                lat[name].append(time.perf_counter() - t)
            cpu[name] += _cpu_seconds(pids) - c0
    return {
        name: {
            "p50_us": round(1e6 * statistics.median(lat[name]), 1),
            "server_cpu_us": round(1e6 * cpu[name] / (step * rounds), 1),
        }
        for name in SHAPES
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.guardcost", description=__doc__)
    p.add_argument("--n", type=int, default=2000, help="statements per shape")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    p.add_argument("--dir", default=".layout-cluster", help="local cluster directory")
    a = p.parse_args(argv)
    cluster = LocalCluster(Path(a.dir).absolute(), servers=1).up()
    servers = Servers(tuple(cluster.addresses), str(cluster.option_file))
    pids = [pid for pid in (s.pid() for s in cluster.servers) if pid is not None]
    raw = RawClient(servers)
    try:
        raw.run(0, ";\n".join(DDL))
        for name in ("insert, today", "insert, no guard", "insert, trigger-guarded"):
            for k in range(a.n // a.rounds):
                raw.run(0, SHAPES[name][0], [k])
        raw.run(0, f"INSERT INTO {BARE} SELECT * FROM {ONE}")
        for table in UPD.values():
            raw.run(0, f"INSERT INTO {table} SELECT *, `added_id` FROM {ONE}")
        out = measure(raw, pids, a.n, a.rounds)
        print("| shape | p50 µs | server CPU µs/statement |\n|---|---|---|")
        for name, r in out.items():
            print(f"| {name} | {r['p50_us']:.0f} | {r['server_cpu_us']:.0f} |")
    finally:
        raw.run(0, f"DROP DATABASE IF EXISTS `{DB}`")
        raw.close()
        cluster.down()


if __name__ == "__main__":
    main()
