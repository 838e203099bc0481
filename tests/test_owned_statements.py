"""The owned layout's guarantee lives in its statements (docs/architecture.md, "Step 3"):
every statement builder of the write and read paths, in both layouts, and what each
carries; ``Server.send`` refusing a batch without the check; and, on real servers, the
triggers and the check refusing a shard that is not owned, with nothing committed."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import MySQLdb
import pytest

from schemaless import DataStore, Index, TableMissing
from schemaless.batch import Batch
from schemaless.cleaner import sql as cleaner_sql
from schemaless.connection import ConnectOptions, Server
from schemaless.counts import APPLIED, backfill_sql
from schemaless.counts import tables_sql as counts_tables_sql
from schemaless.dsn import Address
from schemaless.dumptables import _insert_sql
from schemaless.edges import _Side
from schemaless.edgetables import count_trigger_sql, tables_sql
from schemaless.edgetables import triggers_sql as edge_triggers_sql
from schemaless.feeds import tables_sql as feeds_tables_sql
from schemaless.hashing import shard_of
from schemaless.keys import key_encode
from schemaless.names import quote
from schemaless.owned import (
    ADMIN,
    CHECK,
    COPYING,
    DATABASES,
    GUARD_KEY,
    HELD,
    OWNED,
    TENTATIVE,
    TRIGGERED,
    UNCHECKED,
    VERDICT,
    Shards,
    admin,
    changes_tables_sql,
    check_sql,
    checked_first,
    copying,
    data_db,
    digest,
    disown_sql,
    entities_table_sql,
    guarded,
    in_guarded_transaction,
    index_table_sql,
    locked,
    owns_sql,
    placement,
    shards_sql,
    unguarded,
    verdict,
    verdict_sql,
)
from schemaless.scatter import shard_unions
from schemaless.tables import by_id_sql
from schemaless.topology import Topology
from schemaless.translate import translate
from schemaless.writes import (
    BLIND,
    CREATE,
    LOCKED_ROWS,
    NEW,
    EntityWrite,
    IndexRow,
    WriteMode,
    _entity_sql,
    delete_rows_sql,
    entity_batch_sql,
    fence_owner_sql,
    fires,
    release_sql,
    takeover_sql,
    upsert_rows_sql,
    upsert_sql,
    write_position,
)

DB = data_db("p")
DBS = (DB,) * 16
OLD = tuple(f"p_{s:04d}" for s in range(16))


def _topo(layout: str) -> Topology:
    """16 logical shards on two servers (0-7, 8-15), no indexes."""
    servers = {0: Address("a", 1), 1: Address("b", 1)}
    shards = tuple(s // 8 for s in range(16))
    return Topology("p", 16, 1, 1.0, servers, shards, {}, (), None, layout=layout)


BY_USER = Index("by_user", {"user_id": "int"})
ID = bytes(range(16))


def _write(
    shard: int, mode: WriteMode, body: bytes | None = b"x", want: bool = True
) -> EntityWrite:
    return EntityWrite(DB, shard, bytes([shard]) * 16, 7, 1, body, mode, want)


def _row(shard: int) -> IndexRow:
    return IndexRow(BY_USER, shard, (shard,), ID, 7)


KINDS = {
    "blind": (BLIND, b"x"),
    "create": (CREATE, b"x"),
    "new": (NEW, b"x"),
    "cas": (WriteMode.expect(3), b"x"),
    "delete": (BLIND, None),
    "delete_cas": (WriteMode.expect(3), None),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("changes", [False, True])
def test_every_entity_write_is_triggered_or_checked(kind: str, changes: bool) -> None:
    mode, body = KINDS[kind]
    writes = [_write(3, mode, body), _write(9, mode, body)]
    sql, params, first = entity_batch_sql(writes, [_row(3)], DBS, "fence_1", changes, DB)
    assert sql.count("%s") == len(params)
    statements = sql.split(";\n")
    if kind in ("blind", "create", "new"):  # each fires the insert trigger
        assert sql.startswith(f"{TRIGGERED} START TRANSACTION") and CHECK not in sql
    else:  # an update that may match no row: the check first, its rows locked
        assert statements[:2] == ["START TRANSACTION", _locked_check([3, 9])]
        assert statements[-1] == "COMMIT" and CHECK not in "".join(statements[2:])
    assert all("INSERT INTO" not in s or "(`shard`, " in s for s in statements)
    assert statements[first].split()[0] in ("SELECT", "INSERT", "UPDATE")
    # the tentative form: no check, the same statements otherwise, the same positions
    again, again_params, again_first = entity_batch_sql(
        writes, [_row(3)], DBS, "fence_1", changes, DB, tentative_ok=True
    )
    assert again_params == params
    if fires(writes[0]):
        assert (again, again_first) == (sql, first)
    else:
        assert again.startswith(f"{TENTATIVE} START TRANSACTION") and CHECK not in again
        tentative = again.removeprefix(f"{TENTATIVE} ").split(";\n")
        assert tentative == [statements[0], *statements[2:]]
        assert tentative[again_first] == statements[first]


def _locked_check(shards: list[int]) -> str:
    """``checked_first``'s check of ``shards``, as it sends it."""
    return checked_first(["DO 0"], DB, shards).split(";\n")[1]


def test_a_checked_first_batch_locks_its_owned_rows_before_any_write() -> None:
    check = _locked_check([9, 3, 3])
    assert check.startswith(f"BEGIN NOT ATOMIC {CHECK} {HELD} IF (SELECT COUNT(*) FROM")
    assert "`shard` IN (3, 9) LOCK IN SHARE MODE) < 2 THEN SIGNAL" in check
    assert checked_first(["DO 0"], None, [3]) == "DO 0"  # the layout of databases: as ever


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_counted_writes_keep_their_affected_rows_and_count_on_their_shard(kind: str) -> None:
    mode, body = KINDS[kind]
    keys = () if body is None else (b"k" * 16, b"j" * 16)
    writes = [EntityWrite(DB, s, bytes([s]) * 16, 7, 1, body, mode, True, keys) for s in (9, 3)]
    sql, params, first = entity_batch_sql(writes, [_row(3)], DBS, "fence_1", False, DB)
    assert sql.count("%s") == len(params)
    statements = sql.split(";\n")
    writes_at = [i for i, s in enumerate(statements) if " `entities` " in s or "`entities` (" in s]
    writes_at = [i for i in writes_at if not statements[i].startswith("SELECT")]
    for n, at in enumerate(writes_at):  # each write's affected rows, kept at once
        assert statements[at + 1] == f"SET {APPLIED}{n} = ROW_COUNT()"
    assert write_position(first, 1, writes) - write_position(first, 0, writes) == 2
    counting = [s for s in statements if "`counts`" in s or "`counted_keys`" in s]
    assert len(counting) == (2 if kind == "new" else 4 if keys else 2) * 2
    # only if the write applied (a new id's INSERT applies or fails the whole batch)
    assert all(kind == "new" or f"{APPLIED}0 > 0" in s or f"{APPLIED}1 > 0" in s for s in counting)
    assert all("INSERT INTO" not in s or "(`shard`, " in s for s in counting)
    if kind in ("blind", "create", "new"):  # the entity's insert fires the trigger first
        assert sql.startswith(f"{TRIGGERED} START TRANSACTION") and CHECK not in sql
    else:
        assert statements[1] == _locked_check([3, 9])


def test_the_backfill_of_counts_is_checked_and_locks_each_entity() -> None:
    sql, params = backfill_sql(DB, 3, [(ID, 7, [b"k" * 16]), (bytes(16), 9, [b"j" * 16])])
    statements = sql.split(";\n")
    assert sql.count("%s") == len(params)
    assert statements[0] == "START TRANSACTION" and statements[-1] == "COMMIT"
    assert statements[-2] == check_sql(DB, [3])
    locks = [s for s in statements if s.endswith("FOR UPDATE")]
    assert len(locks) == 2 and all("`version` = %s" in s for s in locks)
    assert all("INSERT INTO" not in s or "(`shard`, " in s for s in statements)


def test_the_layout_of_databases_gets_the_statements_it_always_had() -> None:
    writes = [
        EntityWrite(OLD[3], 3, ID, 7, 1, b"x", BLIND, True),
        EntityWrite(OLD[5], 5, bytes(16), 7, 1, None, BLIND, True),
    ]
    built = [
        entity_batch_sql(writes, [_row(3)], OLD, "fence_1", True)[0],
        upsert_rows_sql([_row(3)], OLD)[0],
        delete_rows_sql([_row(3)], OLD)[0],
        release_sql([_row(3)], OLD)[0],
        by_id_sql(_topo(DATABASES), {3: [ID], 5: [ID]}, "`id`")[0],
    ]
    for sql in built:
        assert "`shard`" not in sql and DB not in sql
        assert CHECK not in sql and TRIGGERED not in sql and ADMIN not in sql


@pytest.mark.parametrize(
    "build",
    [
        lambda: upsert_rows_sql([_row(3), _row(12)], DBS, DB),
        lambda: delete_rows_sql([_row(3), _row(12)], DBS, DB),
        lambda: release_sql([_row(3)], DBS, DB),
    ],
    ids=["step 1", "step 3", "release"],
)
def test_index_row_writes_are_triggered(build: Callable[[], tuple[str, list[Any]]]) -> None:
    sql, params = build()
    assert sql.startswith(TRIGGERED) and CHECK not in sql
    assert sql.count("%s") == len(params)
    if "INSERT" in sql:  # each row names its shard first
        assert "(`shard`, `p_user_id`, `entity_id`, `entity_version`)" in sql
        assert params[:2] == [3, 3] and params[4] == 12


def test_a_step_1_of_many_rows_locks_its_shards_once() -> None:
    """From ``LOCKED_ROWS`` rows (a ``put_many``), step 1 takes its shards' ``owned``
    rows in share mode before its writes, and the triggers skip their lookup."""
    rows = [IndexRow(BY_USER, 3 + i % 2, (i,), ID, 7) for i in range(LOCKED_ROWS)]
    sql, params = upsert_rows_sql(rows, DBS, DB)
    assert sql == locked(sql.split(";\n")[3:-2], DB, [3, 4]) and CHECK in sql
    assert sql.count("%s") == len(params)
    few, _ = upsert_rows_sql(rows[: LOCKED_ROWS - 1], DBS, DB)
    assert few.startswith(TRIGGERED) and CHECK not in few


def test_a_read_by_id_is_its_own_check_of_exactly_its_shards() -> None:
    """One statement joined to the server's digest: rows only if the server owns the
    shards the map places on it (0-7); read again ``counted``, the check of the shards
    named."""
    sql, params = by_id_sql(_topo(OWNED), {3: [ID], 5: [ID, bytes(16)]}, "`id`, `body`")
    assert sql.count("%s") == len(params) == 3 and "UNION" not in sql and CHECK in sql
    assert sql.endswith(owns_sql(tuple(range(8))))
    assert f"`n` = 8 AND d.`d0` = {digest(tuple(range(8)))[1]}" in sql
    sql, params = by_id_sql(_topo(OWNED), {3: [ID]}, "`id`", counted=True)
    assert sql.endswith(verdict_sql(DB, [3])) and "owned_digest" not in sql


def test_a_guarded_read_ends_with_its_verdict_which_the_client_takes_off() -> None:
    """The read, then in the same batch a plain ``SELECT`` of whether every shard named
    is owned (1 or 0), after the rows (a fence in between shows); a scatter's many shards
    read the digest row first.  ``verdict`` takes it off the results, and raises unless
    it says 1."""
    select = f"SELECT 0 AS `k`, `id` FROM {quote(DB, 'entities')} WHERE `id` = %s"
    owned = quote(DB, "owned")
    assert guarded([select], DB, [3]) == (
        f"{select};\nSELECT {CHECK} (SELECT COUNT(*) FROM {owned}"
        f" WHERE `shard` IN (3)) = 1 {VERDICT}"
    )
    several = guarded([select], DB, [5, 3, 5])
    assert several.endswith(f"WHERE `shard` IN (3, 5)) = 2 {VERDICT}")
    scatter = guarded([select], DB, range(0, 200, 2))
    assert "EXISTS (SELECT 1 FROM " in scatter and scatter.endswith(f") = 100 {VERDICT}")
    assert guarded([select], None, [3]) == select
    assert verdict([((0, ID),), ((1,),)], "s") == [((0, ID),)]
    assert verdict([(), ((1,),)], "s") == [()]  # an empty read of an owned shard
    for said in [((0,),), ((None,),), ()]:
        with pytest.raises(TableMissing, match="moved"):
            verdict([((0, ID),), said], "s")
    with pytest.raises(TableMissing, match="moved"):
        verdict([], "s")


def test_unchecked_batches_are_refused_before_they_are_sent() -> None:
    server = Server(Address("127.0.0.1", 9), ConnectOptions())  # nothing listens there
    server.guarded_db = quote(DB)
    plain = f"SELECT `id` FROM {quote(DB, 'entities')} WHERE `id` = %s"
    with pytest.raises(RuntimeError, match="without the ownership check"):
        Batch(server, plain, [ID]).send()
    marks = (f"{TRIGGERED} {plain}", f"{TENTATIVE} {plain}", f"{plain}; {check_sql(DB, [1])}")
    for marked in (admin([plain]), guarded([plain], DB, [1]), *marks):
        reply = Batch(server, marked, [ID]).send()  # refused only by the closed port
        with pytest.raises(Exception, match=r"(?i)connect|unavailable"):
            reply.result()
    one = guarded([plain], DB, [1])
    for misplaced in (f"{one};\n{plain}", f"{one};\n{one}"):  # receive reads the last set
        with pytest.raises(RuntimeError, match="verdict not last, or twice"):
            Batch(server, misplaced, [ID, ID]).send()


def test_a_block_of_shards_is_named_as_one_range() -> None:
    assert shards_sql([5]) == "`shard` IN (5)"
    assert shards_sql(range(2048)) == ("(`shard` BETWEEN 0 AND 2047 AND `shard` MOD 1 = 0)")


@pytest.mark.parametrize("shards,servers", [(8, 2), (4096, 2), (7, 3), (3, 5)])
def test_a_new_owned_datastore_gives_each_server_one_block(shards: int, servers: int) -> None:
    owned = placement(shards, servers, "owned")
    for sid in set(owned):
        held = [s for s in range(shards) if owned[s] == sid]
        assert held == list(range(held[0], held[-1] + 1))  # one run: one BETWEEN
    counts = [owned.count(sid) for sid in range(min(shards, servers))]
    assert max(counts) - min(counts) <= 1
    assert placement(shards, servers, "databases") == [s % servers for s in range(shards)]


def test_shard_unions_filter_and_check_each_server() -> None:
    from schemaless.topology import Topology

    topo = Topology(
        "p",
        4,
        1,
        5.0,
        {0: Address("a", 1), 1: Address("b", 1)},
        (0, 1, 0, 1),
        {},
        (),
        None,
        layout="owned",
    )
    out = shard_unions(topo, lambda s: f"SELECT {s} FROM {quote(topo.dbs[s], 'entities')}")
    assert out[0].endswith(verdict_sql(DB, [0, 2])) and out[1].endswith(verdict_sql(DB, [1, 3]))


# -- on real servers --------------------------------------------------------------------


def _server_of(store: DataStore, shard: int) -> Server:
    return store.cluster.server_of_shard(store.cluster.topology, shard)


def _fence(store: DataStore, shard: int) -> None:
    """A move's fence, by hand: the shard's ``owned`` row deleted on its server."""
    owned = quote(store.cluster.topology.owned_db or "", "owned")
    _server_of(store, shard).run(admin([f"{UNCHECKED}DELETE FROM {owned} WHERE `shard` = {shard}"]))


def _two_on_one(make_store: Callable[..., DataStore]) -> tuple[DataStore, int, int]:
    """A datastore and two logical shards that live on one server (the first server
    of the map) whose other servers hold the rest."""
    store = make_store(shards=2 * len(make_store().cluster.topology.servers))
    on = store.cluster.topology.shard_servers
    first, second = (s for s in range(len(on)) if on[s] == on[0])
    return store, first, second


def _id_on(store: DataStore, shard: int) -> bytes:
    return next(
        key
        for k in range(10_000)
        if store.cluster.shard_of_id(key := k.to_bytes(16, "big")) == shard
    )


def test_the_guard_refuses_a_shard_not_owned_unless_a_move_copies_it(
    make_store: Callable[..., DataStore],
) -> None:
    store, first, _ = _two_on_one(make_store)
    topo = store.cluster.topology
    assert topo.owned_db is not None
    server = _server_of(store, first)
    away = next(s for s in range(topo.n_shards) if topo.shard_servers[s] != topo.shard_servers[0])
    table = quote(topo.owned_db, "entities")
    insert = f"INSERT INTO {table} (`shard`, `id`, `version`, `updated`) VALUES ({away}, %s, 1, 1)"
    with pytest.raises(TableMissing, match="not on this server"):
        server.run(admin([insert]), [ID])
    triggers_only = [f"SET {COPYING} = {away}", insert, f"SET {COPYING} = NULL"]
    with pytest.raises(TableMissing, match="not on this server"):  # the key still refuses
        server.run(admin(triggers_only), [ID])
    server.run(admin(copying(away, [insert])), [ID])  # as a move's copy sends it
    count = f"SELECT COUNT(*) FROM {table} WHERE `id` = %s"
    assert server.run(admin([count]), [ID])[0][0][0] == 1  # the copy went in
    with pytest.raises(TableMissing):  # but the copy is not the server's to update
        moved = "`version` = 2, `updated` = `updated` + 1"  # as every write of the library
        server.run(admin([f"UPDATE {table} SET {moved} WHERE `id` = %s"]), [ID])


def test_a_checked_batch_of_a_fenced_shard_commits_nothing(
    make_store: Callable[..., DataStore],
) -> None:
    store, first, n = _two_on_one(make_store)
    a, b = _id_on(store, first), _id_on(store, n)
    store.put({"id": a, "v": 1})
    store.put({"id": b, "v": 1})
    before = store.get(a)
    assert before is not None
    _fence(store, n)
    topo = store.cluster.topology
    body = store.codec.encode({"id": a, "v": 2})
    writes = [
        EntityWrite(topo.dbs[first], first, a, before.version + 1, 1, body, BLIND, False),
        EntityWrite(topo.dbs[n], n, b, 99, 1, None, WriteMode.expect(1), False),
    ]
    sql, params, _ = entity_batch_sql(writes, (), topo.dbs, topo.fence, False, topo.owned_db)
    with pytest.raises(TableMissing, match="not on this server"):
        _server_of(store, first).run(sql, params, commits=True)
    after = store.get(a)  # shard 0's write, applied, was rolled back
    assert after is not None and after.version == before.version
    for read in (lambda: store.get(b), lambda: store.get_many([a, b])):
        with pytest.raises(TableMissing):  # never a silent "absent"
            read()
    assert store.get(a) == {"id": a, "v": 1}  # the shard still owned reads as before


def test_a_checked_select_of_a_fenced_shard_is_refused_an_owned_empty_one_is_empty(
    make_store: Callable[..., DataStore],
) -> None:
    """An equality query reads its index rows with ``checked_select``: of a shard fenced
    since (the map not yet told), ``TableMissing``, never an empty page; of an owned
    shard with no matching row, an empty page."""
    by_v = Index("by_v", {"v": "int"})
    store = make_store([by_v], shards=4)
    topo = store.cluster.topology
    of = {shard_of(key_encode(v), topo.n_shards): v for v in range(100)}
    fenced, owned_value = of[0], next(v for s, v in of.items() if s != 0)
    store.put({"v": fenced})
    assert len(store.query(by_v, where={"v": fenced})) == 1
    _fence(store, 0)
    with pytest.raises(TableMissing):
        store.query(by_v, where={"v": fenced})
    assert list(store.query(by_v, where={"v": owned_value})) == []


def test_a_maps_shards_are_checked_as_they_are_and_hash_as_a_tuple() -> None:
    placed = Shards(range(0, 4096, 2))
    assert placed == tuple(range(0, 4096, 2)) and hash(placed) == hash(tuple(placed))
    assert check_sql(DB, placed) == check_sql(DB, [*reversed(placed), 0])
    assert {placed: 1}[tuple(placed)] == 1  # the same key in the caches


#: Every plain ``UPDATE`` the library and the Cleaner build, by module and target
#: expression: none a client sends is an edge type's table.  Those have only the
#: guard's ``BEFORE INSERT`` trigger (``guard_sql(upserts_only=True)``), sound only while
#: nothing but an upsert updates them (docs/architecture.md, "Edges and feeds"): a new
#: ``UPDATE`` must be checked against that and listed here.  The one exception is no
#: client statement: the edge table's count trigger (``edgetables.py``, ``{counts}``)
#: updates the count row of the shard its edge's insert guard has just checked (below).
PLAIN_UPDATES = {
    ("schemaless/catalog.py", "{meta}"): 1,
    ("schemaless/counts.py", "{counts}"): 1,
    ("schemaless/indexstates.py", "{meta}"): 2,
    ("schemaless/indexstates.py", "{self._t('indexes')}"): 2,
    ("schemaless/owned.py", "{t}"): 1,
    ("schemaless/shardmap.py", "{self._t('meta')}"): 2,
    ("schemaless/shardmap.py", "{self._t('shards')}"): 1,
    ("schemaless/writes.py", "{quote(db, row.index.table)}"): 1,
    ("schemaless/writes.py", "{table}"): 3,
    ("schemaless/writes.py", "{quote(db_of[s], 'changes_head')}"): 1,
    ("schemaless/edgetables.py", "{counts}"): 1,
    ("cleaner/sql.py", "{table}"): 1,
    ("cleaner/sql.py", "{quote(dbs[shard], 'entities')}"): 1,
}


def test_no_plain_update_reaches_an_edge_or_count_table() -> None:
    root = Path(__file__).resolve().parent.parent
    found: Counter[tuple[str, str]] = Counter()
    for package in ("schemaless", "cleaner"):
        for path in sorted((root / package).rglob("*.py")):
            for target in re.findall(r"(?<!KEY )\bUPDATE\s+(\{[^}]*\})", path.read_text()):
                found[(path.relative_to(root).as_posix(), target)] += 1
    assert dict(found) == PLAIN_UPDATES
    side = _Side(DB, "likes")
    writes = [side.add(3), side.add_counting(3), side.remove(3), side.remove(3, before=True)]
    writes += [_insert_sql(DB, "edges__likes", ("a",), 2)]
    for sql in writes:  # the edge type's own writes: upserts and deletes only
        assert "UPDATE" not in sql.replace("ON DUPLICATE KEY UPDATE", ""), sql
    # the count trigger's update: after the edge's insert (whose guard key checked
    # NEW.shard and holds its owned row), of the count row of that same shard, its only
    # update; so the count table needs no update trigger (one lookup under the hot row)
    (trigger,) = count_trigger_sql(DB, "edges__likes")
    assert f" AFTER INSERT ON {quote(DB, 'edges__likes')} " in trigger
    plain = re.findall(r"(?<!KEY )\bUPDATE [^;]*", trigger)
    counts = quote(DB, "edges__likes__n")
    assert plain == [
        f"UPDATE {counts} SET `n` = `n` + 1 WHERE `shard` = NEW.`shard` AND `node` = NEW.`src`"
    ]
    made = tables_sql(DB, "likes")
    guards = [t for t in made if "TRIGGER" in t and " BEFORE " in t]
    assert [t.split(" FOR EACH ROW")[0].split(" BEFORE ")[1] for t in guards] == [
        f"UPDATE ON {quote(DB, 'edges__likes')}",
        f"INSERT ON {counts}",
    ]
    assert GUARD_KEY in made[0] and GUARD_KEY not in made[1]  # the edge table's key


#: A key too long to name the owner's version as well (``Index.keyed_changes`` False)
WIDE = Index("by_wide", {"w": "str(763)"})


def _shard_tables() -> dict[str, list[str]]:
    """Every table of logical shards' rows the library makes, by what makes it: each
    builder's statements."""
    index = Index("by_n", [("n", "int")], shard_on="n")
    return {
        "entities": entities_table_sql(DB),
        "changes": changes_tables_sql(DB),
        "index": index_table_sql(DB, index),
        "wide index": index_table_sql(DB, WIDE),
        "counts": counts_tables_sql(DB),
        "feeds": feeds_tables_sql(DB, "home"),
        "edges": tables_sql(DB, "likes"),
    }


def test_every_table_of_shards_is_guarded_for_new_and_changed_rows() -> None:
    """Each ``CREATE TABLE`` with a ``shard`` column has the guard key and an update
    trigger, or (an edge type's count table, written by upserts) an insert trigger, or
    the key alone on an index every write of a row changes: ``entities``' first unique
    index ``by_updated`` (``test_every_entity_write_moves_updated``), an index table's
    ``by_shard``, which names its owner and version (``test_every_write_of_an_index_row_
    changes_its_by_shard_entry``) unless that key would be too long."""
    for maker, stmts in _shard_tables().items():
        made = [
            s
            for s in stmts
            if s.startswith("CREATE TABLE") and "`shard` SMALLINT" in s and ".`owned` (" not in s
        ]
        assert made, maker
        for create in made:
            table = create.split(" (", 1)[0].rsplit(".", 1)[1]
            triggers = {
                s.split(" FOR EACH ROW")[0].split(" BEFORE ")[1]
                for s in stmts
                if " BEFORE " in s and f"ON {quote(DB)}.{table}" in s
            }
            if table == "`entities`":
                keys = re.findall(r"(UNIQUE KEY|KEY) `(\w+)` \(`shard`", create)
                assert GUARD_KEY in create and keys[0] == ("UNIQUE KEY", "by_updated")
                assert not triggers
            elif table == "`index_by_n`":
                keys = re.findall(r"KEY `(\w+)` \((`shard`[^)]*)\)", create)
                assert GUARD_KEY in create and not triggers
                assert keys == [("by_shard", "`shard`, `p_n`, `entity_id`, `entity_version`")]
            elif GUARD_KEY in create:
                assert f"UPDATE ON {quote(DB)}.{table}" in triggers, (maker, table)
            else:
                assert table.endswith("__n`") and triggers == {f"INSERT ON {quote(DB)}.{table}"}


@pytest.mark.parametrize("unique", [False, True])
def test_every_write_of_an_index_row_changes_its_by_shard_entry(unique: bool) -> None:
    """An upsert of a present index row and a unique row's takeover assign only columns
    ``by_shard`` names (the owner's version, and its id): so each write that changes a
    row re-adds its entry there, where InnoDB checks the guard key."""
    index = Index("by_n", [("n", "int")], shard_on="n", unique=unique)
    create = index.create_table_sql(DB, shard=True)
    key = re.findall(r"KEY `by_shard` \(([^)]*)\)", create)[0].replace("`", "").split(", ")
    upsert = upsert_sql(DB, index, 2, shard=True).split(" ON DUPLICATE KEY UPDATE ")[1]
    takeover = takeover_sql(IndexRow(index, 0, (1,), ID, 2), DB, ID, 1)[0]
    assigned = re.findall(r"`(\w+)` = ", upsert.split(" IF(")[0])
    assigned += re.findall(r"`(\w+)` = %s", takeover.split(" WHERE ")[0])
    assert assigned and set(assigned) <= set(key), (assigned, key)
    assert key[0] == "shard" and key[-1] == "entity_version" and "entity_id" in key


@pytest.mark.parametrize("kind", ["blind", "create", "cas", "delete", "delete_cas"])
@pytest.mark.parametrize("shard", [False, True])
def test_every_entity_write_moves_updated(kind: str, shard: bool) -> None:
    """Step 2's write of an entity row sets ``updated`` past the stored one whenever it
    changes the row, so the owned layout's guard key (checked on ``by_updated``) meets
    every changed row, not only new ones."""
    write = _entity_sql("p_data", kind, True, None, shard).split(";\n")[-1]
    assert write.count("`updated` = ") == 1  # the one assignment, and it moves it
    later = r"GREATEST\((?:VALUES\(`updated`\)|%s), `updated` \+ 1\)"
    assert re.search(r"`updated` = (?:IF\(@ok := \(.*?\)\), )?" + later, write), write


def test_every_other_update_of_an_entity_row_moves_updated() -> None:
    """The Cleaner's tombstone fence and version bump and a unique claim's fence of an
    owner move ``updated`` too, so each meets the guard key as step 2's writes do."""
    updates = [
        fence_owner_sql(DB, ID, 3, 4, 5, shard=0)[0],
        cleaner_sql.fence_sql((DB,), DB, [(0, ID, 4)], 5)[0],
        cleaner_sql.bump_sql((DB,), DB, 0, ID, 3, 4)[0],
    ]
    for sql in updates:
        (update,) = [s for s in sql.split(";\n") if s.startswith("UPDATE")]
        assigned = update.split(" SET ", 1)[1].split(" WHERE ", 1)[0]
        assert assigned.count("`updated` = ") == 1, update
        assert "`updated` + 1" in assigned.split("`updated` = ", 1)[1], update


@pytest.mark.parametrize(
    ("table", "create", "expected"),
    [
        ("feed__home__inbox", f"CREATE TABLE x (..., {GUARD_KEY})", {"gu"}),
        ("feed__home__inbox", "CREATE TABLE x (...)", {"gi", "gu"}),  # an earlier build's
        ("edges__likes", f"CREATE TABLE x (..., {GUARD_KEY})", {"gu"}),
        ("edges__likes", "CREATE TABLE x (...)", {"gi", "gu"}),
        ("edges__likes__n", "CREATE TABLE x (...)", {"gi"}),
    ],
)
def test_a_copied_or_restored_table_gets_the_guard_its_definition_calls_for(
    table: str, create: str, expected: set[str]
) -> None:
    guards = [s for s in edge_triggers_sql(DB, table, create) if " BEFORE " in s]
    assert {s.split("`")[3].rsplit("_", 1)[1] for s in guards} == expected


def test_insert_ignore_goes_only_where_the_owned_rows_are_held() -> None:
    """IGNORE would make the guard key's refusal a warning (the row skipped, the batch
    committed): ``Server.send`` refuses it unless a check holding the ``owned`` rows
    comes first; an administrative batch (a move's, DDL) may."""
    ignore = f"INSERT IGNORE INTO {quote(DB, 'entities')} (`shard`, `id`) VALUES (3, %s)"
    unguarded(checked_first([ignore], DB, [3]))
    unguarded(admin([ignore]))
    for sql in (
        f"{TRIGGERED} {ignore}",
        f"{TENTATIVE} {ignore}",
        in_guarded_transaction([ignore], DB, [3]),  # checked, but after the write
        ";\n".join([ignore, checked_first(["DO 0"], DB, [3])]),
    ):
        with pytest.raises(RuntimeError, match="INSERT IGNORE"):
            unguarded(sql)


def test_the_guard_keys_refusal_is_table_missing() -> None:
    message = "Cannot add or update a child row: a foreign key constraint fails"
    error = translate("db1:3306", MySQLdb.IntegrityError(1452, message), sent=True, commits=True)
    assert isinstance(error, TableMissing) and "not on this server (moved)" in str(error)


def test_the_fence_and_a_copy_skip_the_keys_check_only() -> None:
    """The fence deletes the ``owned`` row with the key unchecked (its rows stay) and
    waits as long as a move's fence may; a copy's statements are unchecked too, under
    ``@schemaless_copying``, reset after."""
    fence = disown_sql(DB, 7)
    assert fence == (
        "SET STATEMENT foreign_key_checks = 0, innodb_lock_wait_timeout = 10 FOR"
        f" DELETE FROM {quote(DB, 'owned')} WHERE `shard` = 7"
    )
    assert copying(7, ["INSERT 1", "REPLACE 2"]) == [
        f"SET {COPYING} = 7",
        f"{UNCHECKED}INSERT 1",
        f"{UNCHECKED}REPLACE 2",
        f"SET {COPYING} = NULL",
    ]
