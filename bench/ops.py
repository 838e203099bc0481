"""The operations: each once through schemaless and once as the minimal raw SQL.

Layout.  Three datastores hold 0, 1 and 3 indexes (``<prefix>_i0``, ``_i1``, ``_i3``;
the last one is loaded with the dataset and serves every read), and two hold one index
on ``published``, plain (``_t1``) and unique (``_u1``): a put on each shows what the
unique claim costs; ``_c1`` is ``_t1`` with the change feed on (``put_changes``, against
the same raw baseline as ``put_int_idx``: the difference is what the feed costs a put).
Each has a raw twin (``<prefix>_r0``, ``_r1``, ``_r3``, ``_rt1``, ``_ru1``, ``_rc1``)
with the same logical shards on the same servers and tables of the same shape (the
library's own DDL), so both sides touch the same number of rows on the same servers,
with the same durability.

Raw baselines (what an application would write by hand, with no consistency protocol):

* put, k indexes: encode (msgpack + zstd), then per server one round trip, servers in
  parallel: the entity row and the index rows that live on that server, in one
  transaction when there are several statements (autocommit otherwise).
* update of an indexed value: encode, then per server one transaction: UPDATE the
  body, DELETE the index rows the old value produced, INSERT the new ones (the client
  holds the old entity).
* delete: per server one transaction deleting the entity and its index rows (the
  client holds the entity).
* get: ``SELECT body ... WHERE id = %s`` + decode (zstd + msgpack).
* get_many(100): one ``SELECT ... WHERE id IN (...)`` (UNION ALL over the server's
  shards) per server, servers in parallel, + decode.
* equality query (page of 20): the index table's 20 newest rows on the shard, then the
  bodies as in get_many.
* scatter query (page 20 by time, page 1 and page 10): per server one UNION ALL of
  ``(SELECT ... ORDER BY ... LIMIT 20)`` over its shards, merged in Python, then the
  bodies; page 10 starts after the last row of page 9 (keyset, like the library).

As reads decode inside the timed call, writes encode, compute their index rows, route
and build their SQL inside it: the work an application doing it by hand would do.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zstandard

from schemaless import DataStore, Index, new_id
from schemaless.hashing import shard_of
from schemaless.index import key_encode
from schemaless.names import quote
from schemaless.schema import entities_table_sql, shard_db

from .data import Dataset
from .env import RawClient, Servers

__all__ = ["Bench", "Op", "operations"]

BY_USER = Index("by_user", {"user_id": "uuid", "published": "int"}, shard_on="user_id")
BY_TIME = Index("by_time", {"published": "int"}, shard_on="published")
BY_FEED = Index("by_feed", {"feed_id": "uuid"}, shard_on="feed_id")
UNIQUE_TIME = Index("by_time", {"published": "int"}, shard_on="published", unique=True)
INDEXES: dict[str, list[Index]] = {
    "i0": [],
    "i1": [BY_USER],
    "i3": [BY_USER, BY_TIME, BY_FEED],
    "t1": [BY_TIME],  # a plain index on one int ...
    "u1": [UNIQUE_TIME],  # ... and the same one unique: what the claim costs a put
    "c1": [BY_TIME],  # ... and plain with the change feed on: what the feed costs a put
}
PAGE = 20
UPDATE_DELTA = 7  # an update moves ``published`` by this many seconds

_tls = threading.local()


def raw_encode(entity: dict[str, Any]) -> bytes:
    """What a raw client does to store an entity: msgpack + zstd at the library's level,
    behind the library's 2-byte header so both sides read each other's bodies."""
    cctx = getattr(_tls, "cctx", None)
    if cctx is None:
        cctx = _tls.cctx = zstandard.ZstdCompressor(level=3)
    return b"\x01\x01" + cctx.compress(msgpack.packb(entity))


def raw_decode(body: bytes) -> dict[str, Any]:
    """What a raw client does with a stored body: zstd (if compressed) + msgpack."""
    if body[1] == 1:
        dctx = getattr(_tls, "dctx", None)
        if dctx is None:
            dctx = _tls.dctx = zstandard.ZstdDecompressor()
        payload = dctx.decompress(body[2:])
    else:
        payload = body[2:]
    out: dict[str, Any] = msgpack.unpackb(payload, raw=False)
    return out


@dataclass
class Op:
    """One benchmarked operation: work items, and a schemaless and a raw call."""

    name: str
    title: str
    write: bool
    #: (threads, budget) -> [(schemaless argument, raw argument)]; both sides run the
    #: same items in the same order, each through its own iterator
    items: Callable[[int, int], list[tuple[Any, Any]]]
    sl: Callable[[Any], object]
    raw: Callable[[Any], object]
    cycle: bool = False  # items may be reused (reads)
    #: waits for work the schemaless calls left in the background (stale index rows),
    #: so that each timed slice includes it
    settle: Callable[[], object] | None = None


@dataclass
class Bench:
    """Everything the operations need: datastores, raw client, dataset, routing."""

    servers: Servers
    prefix: str
    n_shards: int
    ds: Dataset
    stores: dict[str, DataStore]
    raw: RawClient
    shard_sid: list[int] = field(default_factory=list)  # logical shard -> raw server index
    next_new: Iterator[int] = field(default_factory=itertools.count)
    raw_updated: set[int] = field(default_factory=set)
    order: list[int] = field(default_factory=list)  # entity numbers, shuffled
    update_pos: int = 0
    delete_pos: int = 0

    # -- setup ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        servers: Servers,
        prefix: str,
        n_shards: int,
        ds: Dataset,
        *,
        pool_size: int = 32,
        refresh_interval: float = 5.0,
        tracer: Any = None,
        raw: RawClient | None = None,
    ) -> Bench:
        """Open (creating if needed) the three datastores and the raw twins."""
        stores = {
            kind: DataStore(
                list(servers.addresses),
                indexes,
                prefix=f"{prefix}_{kind}",
                shards=n_shards,
                option_file=servers.option_file,
                pool_size=pool_size,
                refresh_interval=refresh_interval,
                tracer=tracer,
                changes=kind == "c1",
            )
            for kind, indexes in INDEXES.items()
        }
        topo = stores["i3"].cluster.refresh()
        position = {addr: i for i, addr in enumerate(servers.addresses)}
        shard_sid = [position[str(topo.servers[sid])] for sid in topo.shard_servers]
        bench = cls(servers, prefix, n_shards, ds, stores, raw or RawClient(servers), shard_sid)
        bench.next_new = itertools.count(ds.n)
        order = list(range(ds.n))
        random.Random(7).shuffle(order)
        bench.order = order
        return bench

    def raw_db(self, kind: str, shard: int) -> str:
        return shard_db(f"{self.prefix}_r{kind[1:] if kind[0] == 'i' else kind}", shard)

    def create_raw_tables(self) -> None:
        """The raw twins: same shards on the same servers, the library's DDL."""
        by_sid: dict[int, list[str]] = {}
        for kind, indexes in INDEXES.items():
            for shard in range(self.n_shards):
                db = self.raw_db(kind, shard)
                stmts = by_sid.setdefault(self.shard_sid[shard], [])
                stmts.append(f"CREATE DATABASE IF NOT EXISTS {quote(db)}")
                stmts.append(entities_table_sql(db))
                stmts.extend(index.create_table_sql(db) for index in indexes)
        for sid, stmts in by_sid.items():
            self.raw.run(sid, ";\n".join(stmts))

    def databases(self) -> dict[int, list[str]]:
        """Every database of this benchmark, by raw server index."""
        out: dict[int, list[str]] = {i: [] for i in range(len(self.servers.addresses))}
        for kind in INDEXES:
            dbs = self.stores[kind].cluster.topology.dbs  # owned: the data database
            for shard in range(self.n_shards):
                sid = self.shard_sid[shard]
                if dbs[shard] not in out[sid]:
                    out[sid].append(dbs[shard])
                out[sid].append(self.raw_db(kind, shard))
            out[0].append(f"{self.prefix}_{kind}_catalog")
        for sid in out:
            out[sid].append(f"{self.prefix}_json")
            out[sid].append(f"{self.prefix}_naive")
        return out

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.raw.close()

    # -- routing -------------------------------------------------------------------------

    def id_shard(self, key: bytes) -> int:
        return shard_of(key, self.n_shards)

    def row_shard(self, index: Index, row: tuple[Any, ...]) -> int:
        return shard_of(key_encode(row[index.shard_pos]), self.n_shards)

    # -- loading -------------------------------------------------------------------------

    def load(self, start: int, stop: int, batch: int = 500, threads: int = 2) -> dict[str, float]:
        """Entities ``start .. stop-1`` into the indexed datastore and its raw twin."""
        import time

        store = self.stores["i3"]
        chunks = [(a, min(stop, a + batch)) for a in range(start, stop, batch)]

        def sl_chunk(bounds: tuple[int, int]) -> None:
            store.put_many([self.ds.entity(i) for i in range(*bounds)])

        def raw_chunk(bounds: tuple[int, int]) -> None:
            per_sid: dict[int, list[tuple[str, list[Any]]]] = {}
            for i in range(*bounds):
                entity = self.ds.entity(i)
                for sid, stmts in self.raw_insert_plan("i3", entity).items():
                    per_sid.setdefault(sid, []).extend(stmts)
            for sid, stmts in per_sid.items():
                sql, params = _merge_inserts(stmts)
                self.raw.run(sid, sql, params)

        out = {}
        for name, fn in (("schemaless_s", sl_chunk), ("raw_s", raw_chunk)):
            t0 = time.perf_counter()
            _parallel(fn, chunks, threads)
            out[name] = round(time.perf_counter() - t0, 3)
        return out

    # -- raw plans (built inside the timed call) -----------------------------------------

    def raw_insert_plan(
        self, kind: str, entity: dict[str, Any]
    ) -> dict[int, list[tuple[str, list[Any]]]]:
        """Per server: the INSERTs of an entity row and its index rows."""
        key = entity["id"]
        body = raw_encode(entity)
        plan: dict[int, list[tuple[str, list[Any]]]] = {}
        shard = self.id_shard(key)
        for index in INDEXES[kind]:
            for row in index.rows(entity):
                ishard = self.row_shard(index, row)
                plan.setdefault(self.shard_sid[ishard], []).append(
                    (
                        _index_insert_sql(quote(self.raw_db(kind, ishard), index.table), index),
                        [*row, key, 1],
                    )
                )
        table = quote(self.raw_db(kind, shard), "entities")
        plan.setdefault(self.shard_sid[shard], []).append(
            (
                f"INSERT INTO {table} (`id`, `version`, `updated`, `body`) VALUES (%s, 1, %s, %s)",
                [key, entity["updated"] * 1_000_000, body],
            )
        )
        return plan

    def raw_current(self, i: int) -> dict[str, Any]:
        """Entity ``i`` as the raw side stored it (after a raw update, if any)."""
        entity = self.ds.entity(i)
        if i in self.raw_updated:
            entity["published"] += UPDATE_DELTA
        return entity

    # -- raw calls -------------------------------------------------------------------------

    def raw_batches(self, plan: dict[int, list[tuple[str, list[Any]]]]) -> dict[int, Any]:
        """One round trip per server, servers in parallel; a transaction if needed."""
        calls = {}
        for sid, stmts in plan.items():
            if len(stmts) == 1:
                sql, params = stmts[0]
            else:
                sql = "START TRANSACTION;\n" + ";\n".join(s for s, _ in stmts) + ";\nCOMMIT"
                params = [p for _, ps in stmts for p in ps]
            calls[sid] = (sql, params)
        return self.raw.fanout(calls)

    def raw_fetch(self, kind: str, keys: Sequence[bytes]) -> dict[bytes, dict[str, Any]]:
        """Bodies of some ids: one SELECT ... IN per server, servers in parallel."""
        by_sid: dict[int, dict[int, list[bytes]]] = {}
        for key in keys:
            shard = self.id_shard(key)
            by_sid.setdefault(self.shard_sid[shard], {}).setdefault(shard, []).append(key)
        calls = {}
        for sid, shards in by_sid.items():
            parts = []
            params: list[Any] = []
            for shard, ks in shards.items():
                parts.append(
                    f"SELECT `id`, `body` FROM {quote(self.raw_db(kind, shard), 'entities')}"
                    f" WHERE `id` IN ({', '.join(['%s'] * len(ks))})"
                )
                params += ks
            calls[sid] = (" UNION ALL ".join(parts), params)
        out = {}
        for results in self.raw.fanout(calls).values():
            for key, body in results[0]:
                out[bytes(key)] = raw_decode(body)
        return out


def _index_insert_sql(table: str, index: Index) -> str:
    cols = ", ".join(quote(c) for c in index.columns)
    marks = ", ".join(["%s"] * (len(index.columns) + 2))
    return f"INSERT INTO {table} ({cols}, `entity_id`, `entity_version`) VALUES ({marks})"


def _merge_inserts(stmts: list[tuple[str, list[Any]]]) -> tuple[str, list[Any]]:
    """Bulk load: one multi-row INSERT per table, in one transaction."""
    groups: dict[str, list[list[Any]]] = {}
    for sql, row_params in stmts:
        groups.setdefault(sql, []).append(row_params)
    out = ["START TRANSACTION"]
    params: list[Any] = []
    for sql, rows in groups.items():
        head, _, values = sql.partition(" VALUES ")
        out.append(f"{head} VALUES " + ", ".join([values] * len(rows)))
        for row in rows:
            params += row
    out.append("COMMIT")
    return ";\n".join(out), params


def _parallel(fn: Callable[[Any], None], items: list[Any], threads: int) -> None:
    it = iter(items)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for item in it:
                fn(item)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


# -- the operations ----------------------------------------------------------------------


def _put_op(b: Bench, kind: str, ordered: bool = False, own_id: bool = False) -> Op:
    """A put of a new entity, its id made by the store (and by the raw client with the
    same UUIDv7 generator), or with ``own_id`` chosen by the caller (then the store
    cannot know that no row is there: a conditional upsert).  With ``ordered``, against
    a raw baseline that keeps the protocol's commit order: the index rows on other
    servers than the entity's first (servers in parallel), then the entity with its
    local rows in one transaction.  Not a target: it splits the gap to the plain
    baseline into what the ordering costs and what the library adds."""
    n_idx = len(INDEXES[kind])
    store = b.stores[kind]

    def items(threads: int, budget: int) -> list[Any]:
        entities = [b.ds.entity(next(b.next_new)) for _ in range(budget)]
        if not own_id:
            for entity in entities:
                del entity["id"]
        return [(entity, dict(entity)) for entity in entities]

    def raw(entity: dict[str, Any]) -> object:
        if not own_id:
            entity["id"] = new_id()
        plan = b.raw_insert_plan(kind, entity)
        if ordered:  # the rows on other servers than the entity's first
            home = b.shard_sid[b.id_shard(entity["id"])]
            first = {sid: stmts for sid, stmts in plan.items() if sid != home}
            if first:
                b.raw_batches(first)
            plan = {home: plan[home]}
        return b.raw_batches(plan)

    noun = f"{n_idx} index{'es' if n_idx != 1 else ''}"
    if kind in ("t1", "u1", "c1"):
        noun = f"1 {'unique' if kind == 'u1' else 'plain'} int index"
        noun += ", change feed on" if kind == "c1" else ""
    title = f"put new entity{' with its own id' if own_id else ''}, {noun}"
    base = {"t1": "put_int_idx", "u1": "put_unique_idx", "c1": "put_changes"}.get(
        kind, f"put_{n_idx}idx"
    )
    return Op(
        name=base + ("_ordered" if ordered else "") + ("_own_id" if own_id else ""),
        title=title + (" (raw: rows first)" if ordered else ""),
        write=True,
        items=items,
        sl=store.put,
        raw=raw,
        settle=store.flush,
    )


def _update_op(b: Bench) -> Op:
    """Blind put of a loaded entity whose ``published`` moved (2 of 3 indexes change)."""
    store = b.stores["i3"]

    def items(threads: int, budget: int) -> list[Any]:
        out = []
        for _ in range(budget):
            i = b.order[b.update_pos % len(b.order)]
            b.update_pos += 1
            entity = b.ds.entity(i)
            entity["published"] += UPDATE_DELTA
            old = b.raw_current(i)  # what the raw side holds and stored
            b.raw_updated.add(i)
            new = dict(old)
            new["published"] += UPDATE_DELTA
            out.append((entity, (old, new)))
        return out

    def raw(pair: tuple[dict[str, Any], dict[str, Any]]) -> object:
        return b.raw_batches(raw_update_plan(b, *pair))

    return Op("update", "update an indexed value", True, items, store.put, raw, settle=store.flush)


def raw_update_plan(
    b: Bench, old: dict[str, Any], new: dict[str, Any]
) -> dict[int, list[tuple[str, list[Any]]]]:
    """Per server: UPDATE the body, DELETE the old index rows, INSERT the new ones."""
    key = new["id"]
    body = raw_encode(new)
    plan: dict[int, list[tuple[str, list[Any]]]] = {}
    shard = b.id_shard(key)
    plan.setdefault(b.shard_sid[shard], []).append(
        (
            f"UPDATE {quote(b.raw_db('i3', shard), 'entities')} SET `body` = %s,"
            " `version` = `version` + 1, `updated` = %s WHERE `id` = %s",
            [body, new["updated"] * 1_000_000, key],
        )
    )
    for index in INDEXES["i3"]:
        before, after = index.rows(old), index.rows(new)
        for row in before - after:
            ishard = b.row_shard(index, row)
            plan.setdefault(b.shard_sid[ishard], []).append(
                _raw_index_delete(b, index, ishard, row, key)
            )
        for row in after - before:
            ishard = b.row_shard(index, row)
            plan.setdefault(b.shard_sid[ishard], []).append(
                (
                    _index_insert_sql(quote(b.raw_db("i3", ishard), index.table), index),
                    [*row, key, 2],
                )
            )
    return plan


def _raw_index_delete(
    b: Bench, index: Index, shard: int, row: tuple[Any, ...], key: bytes
) -> tuple[str, list[Any]]:
    where = " AND ".join(f"{quote(c)} = %s" for c in index.columns)
    table = quote(b.raw_db("i3", shard), index.table)
    return f"DELETE FROM {table} WHERE {where} AND `entity_id` = %s", [*row, key]


def _delete_op(b: Bench) -> Op:
    """Delete loaded entities, taken from the back of the shuffled order."""
    store = b.stores["i3"]

    def items(threads: int, budget: int) -> list[Any]:
        out = []
        for _ in range(budget):
            i = b.order[-1 - b.delete_pos % len(b.order)]
            b.delete_pos += 1
            entity = b.raw_current(i)
            out.append((entity["id"], entity))
        return out

    def raw(entity: dict[str, Any]) -> object:
        key = entity["id"]
        shard = b.id_shard(key)
        plan: dict[int, list[tuple[str, list[Any]]]] = {}
        plan.setdefault(b.shard_sid[shard], []).append(
            (f"DELETE FROM {quote(b.raw_db('i3', shard), 'entities')} WHERE `id` = %s", [key])
        )
        for index in INDEXES["i3"]:
            for row in index.rows(entity):
                ishard = b.row_shard(index, row)
                plan.setdefault(b.shard_sid[ishard], []).append(
                    _raw_index_delete(b, index, ishard, row, key)
                )
        return b.raw_batches(plan)

    return Op("delete", "delete", True, items, store.delete, raw, settle=store.flush)


def _live_ids(b: Bench, count: int) -> list[bytes]:
    """Ids of loaded entities that updates and deletes leave alive (front half)."""
    half = b.order[: max(1, len(b.order) // 2)]
    rng = random.Random(11)
    return [b.ds.entity(rng.choice(half))["id"] for _ in range(count)]


def _get_op(b: Bench) -> Op:
    store = b.stores["i3"]
    sql = [
        f"SELECT `body` FROM {quote(b.raw_db('i3', s), 'entities')} WHERE `id` = %s"
        for s in range(b.n_shards)
    ]

    def raw(key: bytes) -> object:
        shard = shard_of(key, b.n_shards)
        rows = b.raw.run(b.shard_sid[shard], sql[shard], (key,))[0]
        return raw_decode(rows[0][0]) if rows else None

    return Op(
        "get",
        "get",
        False,
        lambda t, n: [(k, k) for k in _live_ids(b, 5000)],
        store.get,
        raw,
        cycle=True,
    )


def _get_many_op(b: Bench) -> Op:
    store = b.stores["i3"]

    def items(threads: int, budget: int) -> list[Any]:
        ids = _live_ids(b, 100 * 50)
        return [(ids[k : k + 100],) * 2 for k in range(0, len(ids), 100)]

    def raw(keys: list[bytes]) -> object:
        found = b.raw_fetch("i3", keys)
        return [found.get(k) for k in keys]

    return Op("get_many", "get_many(100)", False, items, store.get_many, raw, cycle=True)


def _query_eq_op(b: Bench) -> Op:
    store = b.stores["i3"]
    sql = [
        f"SELECT `entity_id` FROM {quote(b.raw_db('i3', s), BY_USER.table)}"
        " WHERE `p_user_id` = %s ORDER BY `p_published` DESC, `entity_id` DESC"
        f" LIMIT {PAGE}"
        for s in range(b.n_shards)
    ]

    def items(threads: int, budget: int) -> list[Any]:
        rng = random.Random(13)
        return [(b.ds.user_id(rng.randrange(b.ds.users)),) * 2 for _ in range(2000)]

    def sl(user: bytes) -> object:
        return store.query(BY_USER, user_id=user, order="desc", limit=PAGE)

    def raw(user: bytes) -> object:
        shard = shard_of(key_encode(user), b.n_shards)
        rows = b.raw.run(b.shard_sid[shard], sql[shard], (user,))[0]
        keys = [bytes(r[0]) for r in rows]
        found = b.raw_fetch("i3", keys)
        return [found[k] for k in keys if k in found]

    return Op("query_eq", "query shard_on equality, page of 20", False, items, sl, raw, True)


def raw_scatter(b: Bench, after: tuple[int, bytes] | None) -> list[dict[str, Any]]:
    """Raw scatter: every logical shard's newest rows (one statement per server)."""
    table = BY_TIME.table
    where = ""
    params: list[Any] = []
    if after is not None:
        where = " WHERE `p_published` < %s OR (`p_published` = %s AND `entity_id` < %s)"
        params = [after[0], after[0], after[1]]
    calls = {}
    for sid in range(len(b.servers.addresses)):
        shards = [s for s in range(b.n_shards) if b.shard_sid[s] == sid]
        if not shards:
            continue
        sql = " UNION ALL ".join(
            f"(SELECT `p_published`, `entity_id` FROM {quote(b.raw_db('i3', s), table)}{where}"
            f" ORDER BY `p_published` DESC, `entity_id` DESC LIMIT {PAGE})"
            for s in shards
        )
        if len(shards) > 1:  # the server merges its shards: PAGE rows, not PAGE each
            sql += f" ORDER BY `p_published` DESC, `entity_id` DESC LIMIT {PAGE}"
        calls[sid] = (sql, params * len(shards))
    rows = [(int(p), bytes(e)) for res in b.raw.fanout(calls).values() for p, e in res[0]]
    rows.sort(reverse=True)
    keys = [e for _, e in rows[:PAGE]]
    found = b.raw_fetch("i3", keys)
    return [found[k] for k in keys if k in found]


def _scatter_op(b: Bench, page: int) -> Op:
    store = b.stores["i3"]

    def items(threads: int, budget: int) -> list[Any]:
        if page == 1:
            return [(None, None)]
        cursor = None
        for _ in range(page - 1):
            cursor = store.query(BY_TIME, order="desc", limit=PAGE, cursor=cursor).cursor
        # the raw side's keyset position: the last row of page (page - 1), computed raw
        after = None
        for _ in range(page - 1):
            got = raw_scatter(b, after)
            after = (got[-1]["published"], got[-1]["id"])
        return [(cursor, after)]

    def sl(cursor: str | None) -> object:
        return store.query(BY_TIME, order="desc", limit=PAGE, cursor=cursor)

    def raw(after: tuple[int, bytes] | None) -> object:
        return raw_scatter(b, after)

    name = f"scatter_p{page}"
    title = f"scatter query by time, page {page} of 20" + (" (cursor)" if page > 1 else "")
    return Op(name, title, False, items, sl, raw, cycle=True)


def operations(b: Bench) -> list[Op]:
    """Every operation, in the order they run (writes that remove data last)."""
    return [
        _put_op(b, "i0"),
        _put_op(b, "i0", own_id=True),
        _put_op(b, "i1"),
        _put_op(b, "i3"),
        _put_op(b, "t1"),
        _put_op(b, "u1"),
        _put_op(b, "c1"),
        _put_op(b, "i1", ordered=True),
        _put_op(b, "i3", ordered=True),
        _get_op(b),
        _get_many_op(b),
        _query_eq_op(b),
        _scatter_op(b, 1),
        _scatter_op(b, 10),
        _update_op(b),
        _delete_op(b),
    ]
