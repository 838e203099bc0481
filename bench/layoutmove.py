"""Moving one logical shard between servers in each layout of ``bench.layouts``.

The same steps as ``schemaless.move`` (copy, fence, verify, flip), cut to what differs
between layouts (nothing writes during these moves, so there is no final sync):

* ``a`` (today's): copy the shard's two tables; fence with one ``RENAME TABLE`` of both
  into a side database on the source.
* ``b_lead`` / ``b_key``: copy the shard's rows; there is no table of the shard to
  rename, so the "fence" deletes its rows on the source (a stale writer still succeeds).
* ``c`` (partitioned): ``ADD PARTITION`` on the target, copy; fence with ``EXCHANGE
  PARTITION`` of each table with an empty side table, then ``DROP PARTITION``.

Each layout moves two shards: one idle, one while another connection holds a
transaction open on another shard of the source server (what the fence waits for), and
a probe reads a third shard of that server (what the fence blocks).  After a move the
stale client's view is tried: a write and a read at the shard's old place.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import MySQLdb

from schemaless.names import quote
from schemaless.schema import entities_table_sql

from .env import RawClient, Servers
from .layouts import Placement, partition_name
from .ops import BY_USER

__all__ = ["MoveResult", "move_shard"]

#: a table's row count and a digest of its rows: (entities, index)
_DIGEST = tuple(
    f"SELECT COUNT(*), COALESCE(SUM(CRC32(CONCAT_WS(',', {cols}))), 0) FROM {{table}}{{where}}"
    for cols in (
        "HEX(`id`), `version`, `updated`, COALESCE(CRC32(`body`), 0)",
        "HEX(`p_user_id`), `p_published`, HEX(`entity_id`), `entity_version`",
    )
)
_COPY_CHUNK = 1000


@dataclass
class MoveResult:
    """What one move took and what a stale client meets afterwards."""

    kind: str
    shard: int
    rows: int  # entity rows + index rows moved
    copy_s: float
    fence_s: float
    verify_s: float
    held_s: float = 0.0  # another shard's transaction held open during the fence
    probe_max_ms: float = 0.0  # slowest read of a third shard during the fence
    stale_write: str = ""
    stale_read: str = ""


class _Kind:
    """Where a shard's rows are in one layout's tables."""

    def __init__(self, kind: str, place: Placement) -> None:
        self.kind, self.place = kind, place
        suffix = {"b_lead": "b", "b_key": "k", "c": "c", "d": "d"}.get(kind)
        self.names = ("entities", BY_USER.table)
        if suffix is not None:
            self.names = (f"entities_{suffix}", f"index_{suffix}")

    def table(self, shard: int, i: int) -> str:
        """The shard's i-th table (0: entities, 1: index)."""
        if self.kind == "a":
            return quote(self.place.shard_db(shard), self.names[i])
        return quote(self.place.one_db, self.names[i])

    def where(self, shard: int) -> str:
        return "" if self.kind == "a" else f" WHERE `shard` = {int(shard)}"

    def side(self, shard: int, i: int) -> str:
        return quote(self.place.side_db, f"s{shard:04d}_{self.names[i]}")

    @property
    def owned(self) -> str:
        return quote(self.place.one_db, "owned")


def move_shard(
    servers: Servers,
    raw: RawClient,
    kind: str,
    place: Placement,
    shard: int,
    target: int,
    hold: tuple[int, int, bytes, float] | None = None,
) -> MoveResult:
    """Move ``shard`` to server ``target``; ``hold``: (shard whose transaction stays
    open during the fence, shard to probe, a key of it, seconds to hold)."""
    k, source = _Kind(kind, place), place.sid(shard)
    t0 = time.perf_counter()
    _prepare_target(raw, k, shard, target)
    rows = sum(_copy(raw, k, shard, i, source, target) for i in (0, 1))
    before = [
        raw.run(source, _DIGEST[i].format(table=k.table(shard, i), where=k.where(shard)))
        for i in (0, 1)
    ]
    _prepare_side(raw, k, shard, source)
    t1 = time.perf_counter()
    held_s = probe_ms = 0.0
    if hold:
        fence_s, probe_ms = _under_load(
            servers, k, source, lambda: _fence(raw, k, shard, source), hold
        )
        held_s = hold[3]
    else:
        _fence(raw, k, shard, source)
        fence_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    after = [
        raw.run(target, _DIGEST[i].format(table=k.table(shard, i), where=k.where(shard)))
        for i in (0, 1)
    ]
    if after != before:
        raise AssertionError(f"{kind}: shard {shard} differs after its move: {before} {after}")
    if k.kind == "d":  # the target owns it, then the map flips; the old rows go
        raw.run(target, f"INSERT INTO {k.owned} VALUES ({int(shard)})")
    place.moved[shard] = target
    t3 = time.perf_counter()
    write, read = _stale(servers, k, shard, source)
    if k.kind == "d":
        raw.run(
            source, ";\n".join(f"DELETE FROM {k.table(shard, i)}{k.where(shard)}" for i in (0, 1))
        )
    return MoveResult(
        kind,
        shard,
        rows,
        round(t1 - t0, 4),
        round(fence_s, 4),
        round(t3 - t2, 4),
        held_s,
        probe_ms,
        write,
        read,
    )


def _prepare_target(raw: RawClient, k: _Kind, shard: int, target: int) -> None:
    if k.kind == "a":
        db = k.place.shard_db(shard)
        ddl = [f"CREATE DATABASE IF NOT EXISTS {quote(db)}", entities_table_sql(db)]
        raw.run(target, ";\n".join([*ddl, BY_USER.create_table_sql(db)]))
    elif k.kind == "c":
        part = f"PARTITION `{partition_name(shard)}` VALUES IN ({int(shard)})"
        for i in (0, 1):
            raw.run(target, f"ALTER TABLE {k.table(shard, i)} ADD PARTITION ({part})")


def _copy(raw: RawClient, k: _Kind, shard: int, i: int, source: int, target: int) -> int:
    rows = raw.run(source, f"SELECT * FROM {k.table(shard, i)}{k.where(shard)}")[0]
    for a in range(0, len(rows), _COPY_CHUNK):
        chunk = rows[a : a + _COPY_CHUNK]
        marks = ", ".join(["(" + ", ".join(["%s"] * len(chunk[0])) + ")"] * len(chunk))
        raw.run(
            target,
            f"INSERT INTO {k.table(shard, i)} VALUES {marks}",
            [x for row in chunk for x in row],
        )
    return len(rows)


def _prepare_side(raw: RawClient, k: _Kind, shard: int, source: int) -> None:
    """The side database (and for ``c``, the empty tables to exchange with)."""
    stmts = [f"CREATE DATABASE IF NOT EXISTS {quote(k.place.side_db)}"]
    if k.kind == "c":
        for i in (0, 1):
            stmts.append(f"CREATE TABLE {k.side(shard, i)} LIKE {k.table(shard, i)}")
            stmts.append(f"ALTER TABLE {k.side(shard, i)} REMOVE PARTITIONING")
    raw.run(source, ";\n".join(stmts))


def _fence(raw: RawClient, k: _Kind, shard: int, source: int) -> None:
    if k.kind == "a":
        pairs = ", ".join(f"{k.table(shard, i)} TO {k.side(shard, i)}" for i in (0, 1))
        raw.run(source, f"RENAME TABLE {pairs}")
    elif k.kind == "c":
        part = quote(partition_name(shard))
        raw.run(
            source,
            ";\n".join(
                f"ALTER TABLE {k.table(shard, i)} EXCHANGE PARTITION {part} WITH TABLE"
                f" {k.side(shard, i)}; ALTER TABLE {k.table(shard, i)} DROP PARTITION {part}"
                for i in (0, 1)
            ),
        )
    elif k.kind == "d":
        raw.run(source, f"DELETE FROM {k.owned} WHERE `shard` = {int(shard)}")
    else:
        raw.run(
            source,
            "START TRANSACTION; "
            + "; ".join(f"DELETE FROM {k.table(shard, i)}{k.where(shard)}" for i in (0, 1))
            + "; COMMIT",
        )


def _under_load(
    servers: Servers,
    k: _Kind,
    source: int,
    fence: Callable[[], None],
    hold: tuple[int, int, bytes, float],
) -> tuple[float, float]:
    """Run ``fence`` while a transaction on another shard of the source is open for
    ``seconds`` and a probe reads a third shard; (the fence's seconds, the probe's
    slowest read in ms)."""
    held_shard, probe_shard, key, seconds = hold
    started, done = threading.Event(), threading.Event()
    worst = [0.0]

    def holder() -> None:
        db = servers.connect(source)
        try:
            cur = db.cursor()
            cur.execute("START TRANSACTION")
            cur.execute(f"SELECT COUNT(*) FROM {k.table(held_shard, 0)}{k.where(held_shard)}")
            cur.fetchall()
            started.set()
            time.sleep(seconds)
            cur.execute("COMMIT")
        finally:
            db.close()

    def probe() -> None:
        db = servers.connect(source)
        try:
            cur = db.cursor()
            sql = f"SELECT `body` FROM {k.table(probe_shard, 0)} WHERE `id` = %s"
            while not done.is_set():
                t = time.perf_counter()
                cur.execute(sql, (key,))
                cur.fetchall()
                worst[0] = max(worst[0], time.perf_counter() - t)
                time.sleep(0.002)
        finally:
            db.close()

    threads = [threading.Thread(target=holder), threading.Thread(target=probe)]
    threads[0].start()
    started.wait(30)
    threads[1].start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    try:
        fence()
        took = time.perf_counter() - t0
    finally:
        time.sleep(0.01)
        done.set()
        for t in threads:
            t.join()
    return took, round(worst[0] * 1000, 2)


def _stale(servers: Servers, k: _Kind, shard: int, source: int) -> tuple[str, str]:
    """What a client with the old map meets at the source: a write (rolled back) and a
    read of the shard's old place (for ``d``: the read batch's ownership count)."""
    table, where = k.table(shard, 0), k.where(shard) or " WHERE 1"
    if k.kind == "a":
        write = f"INSERT INTO {table} (`id`, `version`, `updated`) VALUES (%s, 1, 1)"
        params: tuple[Any, ...] = (b"\0" * 16,)
    elif k.kind == "d":
        write = (
            f"INSERT INTO {table} (`shard`, `id`, `version`, `updated`)"
            f" SELECT `shard`, %s, 1, 1 FROM {k.owned}{where}"
        )
        params = (b"\0" * 16,)
    else:
        write = f"INSERT INTO {table} (`shard`, `id`, `version`, `updated`) VALUES (%s, %s, 1, 1)"
        params = (shard, b"\0" * 16)
    read = f"SELECT COUNT(*) FROM {k.owned if k.kind == 'd' else table}{where}"
    return _try(servers, source, write, params), _try(servers, source, read, ())


def _try(servers: Servers, sid: int, sql: str, params: tuple[Any, ...]) -> str:
    """``sql`` in a transaction rolled back: "N rows read", "N rows written" or
    "error NNNN"."""
    db = servers.connect(sid)
    try:
        cur = db.cursor()
        cur.execute("START TRANSACTION")
        try:
            cur.execute(sql, params or None)
            rows = cur.fetchall() or ()
            return f"{rows[0][0]} rows read" if rows else f"{cur.rowcount} rows written"
        except MySQLdb.MySQLError as exc:
            return f"error {exc.args[0]}"
        finally:
            cur.execute("ROLLBACK")
    finally:
        db.close()
