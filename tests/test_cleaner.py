"""The Cleaner in-process, against the real local cluster: backfill under concurrent
writers, the race cases of the design notes, orphans of crashed writers, purge."""

from __future__ import annotations

import io
import logging
import random
import threading
import time
import urllib.request
from typing import Any

import pytest
from conftest import assert_clean, same_store, shard_rows

from schemaless import DataStore, Index, failpoints
from schemaless.catalog import Topology
from schemaless.cleaner import Cleaner, runtime
from schemaless.cleaner.access import read_entities, read_rows
from schemaless.cleaner.progress import Progress, end_progress_lines
from schemaless.cleaner.runtime import Shutdown
from schemaless.cleaner.throttle import TokenBucket
from schemaless.cleaner.verify import diff_indexes
from schemaless.errors import (
    CatalogError,
    ConflictError,
    SchemalessError,
    ShardUnavailable,
    TableMissing,
)
from schemaless.failpoints import FailpointError
from schemaless.hashing import shard_of
from schemaless.ids import new_id
from schemaless.local import LocalCluster
from schemaless.names import quote
from schemaless.owned import admin
from schemaless.scatter import shard_is

BY_LINK = Index("by_link", {"link": "str(100)"})
BY_TAG = Index("by_tag", {"tags": "str(20)", "n": "int"}, multi="tags")


def load(store: DataStore, n: int, start: int = 0) -> list[bytes]:
    """Put ``n`` entities; their ids."""
    ids: list[bytes] = []
    for lo in range(start, start + n, 500):
        batch = [
            {"link": f"http://example.com/{i}", "tags": [f"t{i % 7}", f"u{i % 3}"], "n": i}
            for i in range(lo, min(lo + 500, start + n))
        ]
        store.put_many(batch)
        ids += [e["id"] for e in batch]
    return ids


def step1_rows(store: DataStore, index: Index, entity: dict[str, Any]) -> set[tuple[Any, ...]]:
    """The rows of an entity that step 1 writes: those on another server than the
    entity's (the others are upserted with the entity, in its transaction)."""
    topo = store.cluster.refresh()
    home = topo.shard_servers[shard_of(entity["id"], topo.n_shards)]
    return {
        values
        for values in index.rows(entity)
        if topo.shard_servers[shard_of(index.shard_key(values), topo.n_shards)] != home
    }


def rows_of(store: DataStore, index: Index, entity_id: bytes) -> dict[tuple[Any, ...], int]:
    """``values -> entity_version`` of an entity's rows in an index (every shard)."""
    store.flush()  # the stale rows of earlier writes deleted
    topo = store.cluster.refresh()
    return {r.values: r.version for r in read_rows(store, topo, [index], [entity_id])}


def plant(store: DataStore, index: Index, values: tuple[Any, ...], key: bytes, version: int) -> int:
    """Insert an index row with raw SQL on the shard it belongs to; the shard."""
    topo = store.cluster.refresh()
    shard = shard_of(index.shard_key(values), topo.n_shards)
    lead = [shard] if topo.owned_db else []  # the owned layout's rows carry their shard
    cols = ", ".join(quote(c) for c in (*(["shard"] if lead else []), *index.columns))
    marks = ", ".join(["%s"] * (len(lead) + len(values) + 2))
    store.cluster.server_of_shard(topo, shard).run(
        admin(
            [
                f"INSERT INTO {quote(topo.dbs[shard], index.table)}"
                f" ({cols}, `entity_id`, `entity_version`) VALUES ({marks})"
            ]
        ),
        [*lead, *values, key, version],
    )
    return shard


# -- backfill --------------------------------------------------------------------------


def test_backfill_under_concurrent_writers(
    make_store: Any, local_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="schemaless")  # shown if the index is not exact
    store = make_store()
    ids = load(store, 3000)
    writers_store = same_store(local_cluster, store)  # learns of the index on refresh
    assert store.declare_index(BY_LINK) == "building"
    stop = threading.Event()
    errors: list[BaseException] = []
    done = [0]

    def writer(mine: list[bytes], seed: int) -> None:
        rnd = random.Random(seed)
        live = list(mine)
        try:
            while not stop.is_set():
                op = rnd.random()
                if op < 0.3:
                    entity = {"link": f"http://new.example/{rnd.random()}", "n": 1}
                    writers_store.put(entity)
                    live.append(entity["id"])
                elif op < 0.6 and live:
                    key = rnd.choice(live)
                    link = f"http://changed.example/{rnd.random()}"
                    writers_store.update(key, lambda e, link=link: {**(e or {}), "link": link})
                elif op < 0.8 and live:
                    key = live.pop(rnd.randrange(len(live)))
                    writers_store.delete(key)
                elif live:
                    key = rnd.choice(live)
                    writers_store.put({"id": key, "link": f"http://blind.example/{seed}"})
                done[0] += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(ids[i::3], i), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    try:
        cleaner = Cleaner(store, batch=200)
        assert cleaner.backfill("by_link") == "ready"
        time.sleep(0.2)  # writes after the backfill are the writers' own business
    finally:
        stop.set()
        for t in threads:
            t.join()
        writers_store.close()
    assert not errors, errors
    assert done[0] > 50  # the writers really ran during the backfill
    assert store.cluster.refresh().indexes["by_link"].state == "ready"
    figures = cleaner.figures.as_dict()
    assert figures["rows_backfilled"] >= 2000
    diff = diff_indexes(store, ["by_link"])["by_link"]  # with what the writers logged
    extra = {rk: (version, store.get(rk[2])) for rk, version in diff.extra.items()}
    assert diff.clean, (diff.summary(), extra, figures, caplog.text)
    # resumable: every shard's checkpoint is done
    checkpoints = store.cluster.catalog.checkpoints("backfill:by_link")
    assert len(checkpoints) == 8 and all(done for _, done, _ in checkpoints.values())


def entity_keys(store: DataStore, index: Index) -> dict[int, bool]:
    """Whether each logical shard's table of ``index`` has ``KEY by_entity``."""
    topo = store.cluster.refresh()
    out = {}
    for shard in range(topo.n_shards):
        rows = store.cluster.server_of_shard(topo, shard).run(
            "SELECT COUNT(*) FROM information_schema.statistics"
            " WHERE table_schema = %s AND table_name = %s AND index_name = 'by_entity'",
            (topo.dbs[shard], index.table),
        )[0]
        out[shard] = int(rows[0][0]) > 0
    return out


def test_the_entity_key_is_built_when_the_backfill_ends(make_store: Any) -> None:
    store = make_store()
    load(store, 300)
    assert store.declare_index(BY_LINK) == "building"
    assert not any(entity_keys(store, BY_LINK).values())  # inserts without it
    seen: list[tuple[str, dict[int, bool]]] = []

    def before_ready() -> None:
        state = store.cluster.refresh().indexes["by_link"].state
        seen.append((state, entity_keys(store, BY_LINK)))
        raise FailpointError("crash before marking ready")

    failpoints.set("cleaner.after_entity_key", before_ready)
    with pytest.raises(FailpointError):
        Cleaner(store, batch=100).backfill("by_link")
    failpoints.clear()
    ((state, keys),) = seen
    assert state == "building" and all(keys.values())
    # a crash while the keys were being built: some tables have it, some not (shard
    # 0's: in the owned layout, the table of every shard of its server)
    topo = store.cluster.refresh()
    store.cluster.server_of_shard(topo, 0).run(
        admin([f"DROP INDEX `by_entity` ON {quote(topo.dbs[0], BY_LINK.table)}"])
    )
    assert not all(entity_keys(store, BY_LINK).values())
    assert Cleaner(store, batch=100).backfill("by_link") == "ready"
    assert all(entity_keys(store, BY_LINK).values())
    assert_clean(store, "by_link")


def test_an_index_declared_on_an_empty_datastore_has_its_entity_key(make_store: Any) -> None:
    store = make_store()
    assert store.declare_index(BY_LINK) == "ready"
    assert all(entity_keys(store, BY_LINK).values())


def test_one_cleaner_at_a_time_backfills_an_index_part(make_store: Any) -> None:
    """A second ``cleaner --index`` of the same index (and part) while the first runs
    is refused; both used to do all the work, twice the load on the servers."""
    store = make_store()
    load(store, 400)
    assert store.declare_index(BY_LINK) == "building"
    in_batch, go_on = threading.Event(), threading.Event()

    def hold() -> None:
        in_batch.set()
        assert go_on.wait(30)

    failpoints.set("cleaner.after_batch", hold)
    results: list[str] = []
    first = threading.Thread(
        target=lambda: results.append(Cleaner(store, batch=50).backfill("by_link"))
    )
    first.start()
    try:
        assert in_batch.wait(30)
        with pytest.raises(CatalogError, match="another Cleaner is running backfill:by_link"):
            Cleaner(store, batch=50).backfill("by_link")
    finally:
        failpoints.clear("cleaner.after_batch")
        go_on.set()
        first.join()
    assert results == ["ready"]
    assert_clean(store, "by_link")


def test_purging_an_index_keeps_the_checkpoints_of_the_others(make_store: Any) -> None:
    """Purging ``by_x`` deleted the checkpoints of every job ending like ``:by_x`` as a
    LIKE pattern (``_`` matches any character): ``byax``'s backfill lost its own."""
    store = make_store()
    load(store, 50)
    byax, by_x = Index("byax", {"n": "int"}), Index("by_x", {"n": "int"})
    for index in (byax, by_x):
        assert store.declare_index(index) == "building"
    assert Cleaner(store).backfill("byax") == "ready"
    catalog = store.cluster.catalog
    kept = catalog.checkpoints("backfill:byax")
    assert len(kept) == 8
    store.drop_index("by_x")
    store.purge_index("by_x")
    assert catalog.checkpoints("backfill:byax") == kept


def test_the_grace_period_runs_on_the_catalog_servers_clock(
    make_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A declaring client whose clock is an hour behind must not shorten the grace."""
    store = make_store()
    load(store, 5)
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() - 3600 * 10**9)
    assert store.declare_index(BY_LINK) == "building"
    monkeypatch.undo()
    changed = store.cluster.refresh().indexes["by_link"].changed
    assert abs(changed - store.cluster.catalog.server_now_us()) < 60 * 10**6
    started = time.monotonic()
    assert Cleaner(store).backfill("by_link") == "ready"
    assert time.monotonic() - started >= 2 * 0.2 + 1.0 - 0.1  # waited out the grace


@pytest.mark.parametrize("kind", ["update", "new"])
def test_a_writer_paused_past_the_grace_period_still_indexes_its_write(
    make_store: Any, local_cluster: LocalCluster, kind: str
) -> None:
    """A writer whose map predates an index, paused between steps 1 and 2 while the
    index is declared and backfilled to ready, must not commit without the index's
    row: the declaration dropped the fence its step 2 names, so it refreshes and
    writes again with the index, and the query finds the entity."""
    store = make_store()
    ids = load(store, 20)
    writer = same_store(local_cluster, store)  # its own map, loaded before the index
    entity: dict[str, Any] = {"link": "http://example.com/moved", "n": 3}
    if kind == "update":
        entity["id"] = ids[3]
    writer.put({"link": "warm-up", "n": 0})  # the map in use: no index
    declared: list[str] = []

    def declare_and_backfill() -> None:  # while the writer waits before its step 2
        if not declared:
            declared.append(store.declare_index(BY_LINK))
            declared.append(Cleaner(store).backfill("by_link"))  # after the grace period

    failpoints.set("put.after_index_rows", declare_and_backfill)
    writer.put(entity)
    failpoints.clear()
    assert declared == ["building", "ready"]
    store.cluster.refresh()
    found = store.query("by_link", link="http://example.com/moved")
    assert [e["id"] for e in found] == [entity["id"]]
    writer.flush()
    assert_clean(store, "by_link")
    writer.close()


def test_a_backfill_refuses_while_an_interrupted_declaration_left_fences(
    make_store: Any,
) -> None:
    """A declaration that died after recording the index but before dropping the old
    fences: writers with an older map could still commit, so the Cleaner refuses to
    backfill until the declaration is run again, which finishes it."""
    store = make_store()
    load(store, 20)
    topo = store.cluster.refresh()
    store.cluster.create_index_tables(topo, BY_LINK)
    store.cluster.create_fences(topo, topo.index_epoch + 1)
    assert store.cluster.catalog.record_index(BY_LINK, "building", topo.index_epoch)
    assert store.cluster.catalog.record_index(BY_TAG, "building", topo.index_epoch) is None
    with pytest.raises(SchemalessError, match="fences of an older index epoch remain"):
        Cleaner(store).backfill("by_link")
    assert store.declare_index(BY_LINK) == "building"  # finishes the declaration
    now = store.cluster.refresh()
    epochs = {e for dbs in store.cluster.fences(now).values() for _, e in dbs}
    assert epochs == {topo.index_epoch + 1} == {now.index_epoch}
    assert Cleaner(store).backfill("by_link") == "ready"
    assert_clean(store, "by_link")


def test_backfill_of_ready_or_unknown_index(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    assert Cleaner(store).backfill("by_link") == "ready"
    with pytest.raises(SchemalessError, match="no index named 'nope'"):
        Cleaner(store).backfill("nope")


def test_backfill_sets_aside_unindexable_and_corrupt(make_store: Any) -> None:
    store = make_store()
    ids = load(store, 40)
    long = {"link": "x" * 300, "n": 1}  # too long for str(100): set aside
    store.put(long)
    topo = store.cluster.refresh()
    victim = ids[0]
    shard = shard_of(victim, topo.n_shards)
    store.cluster.server_of_shard(topo, shard).run(
        admin([f"UPDATE {quote(topo.dbs[shard], 'entities')} SET body = %s WHERE id = %s"]),
        [b"\x09garbage", victim],
    )
    store.declare_index(BY_LINK, force=True)
    cleaner = Cleaner(store)
    # without the unfit entity's rows the index would not be a superset: it stays building
    assert cleaner.backfill("by_link") == "building"
    figures = cleaner.figures.as_dict()
    assert (figures["unindexable"], figures["corrupt"]) == (1, 1)
    assert figures["rows_backfilled"] == 39
    assert figures["rechecked"] == 0  # nobody wrote meanwhile: every batch's proof held
    (_, unfit) = store.cluster.catalog.blocks("by_link")
    assert sum(count for count, _ in unfit.values()) == 1
    # a corrupt entity cannot be read by any query either: it does not block the index
    store.delete(long["id"])
    assert Cleaner(store).backfill("by_link") == "ready"


def test_backfill_in_paced_bursts(make_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``burst``, a batch's upserts go in rounds of at most ``burst`` rows per
    server, each paid to the throttle before it is sent; the batch's entity rows are
    paid in full, and the index ends as the oracle says."""
    store = make_store()
    load(store, 300)
    store.declare_index(BY_TAG)
    from schemaless.cleaner import access

    rounds: list[int] = []
    upsert = access.upsert_grouped

    def recorded(*args: Any, **kwargs: Any) -> Any:
        pace = args[5]
        assert pace is not None and args[4] == 7

        def pace_and_record(rows: int) -> None:
            rounds.append(rows)
            pace(rows)

        return upsert(*args[:5], pace_and_record)

    monkeypatch.setattr("schemaless.cleaner.backfill.upsert_grouped", recorded)
    cleaner = Cleaner(store, batch=100, burst=7)
    paid: list[int] = []
    throttle = cleaner.rt.throttle
    monkeypatch.setattr(cleaner.rt, "throttle", lambda rows: (paid.append(rows), throttle(rows)))
    assert cleaner.backfill("by_tag") == "ready"
    servers = len(store.cluster.current().servers)
    figures = cleaner.figures.as_dict()
    assert sum(rounds) == figures["rows_backfilled"] == 600  # two tags each
    assert max(rounds) <= 7 * servers and len(rounds) >= 600 // (7 * servers)
    assert sum(p for p in paid if p > 0) == figures["rows_checked"] == 300
    assert_clean(store)


def test_backfill_proof_over_added_id_gaps(make_store: Any) -> None:
    """Rows gone from a shard (purged tombstones) leave gaps in ``added_id``: a batch's
    proof covers its runs exactly, holds when nothing changed, and fails (the versions
    are read again) when a writer changed one of its entities."""
    store = make_store(shards=2)
    load(store, 300)
    topo = store.cluster.refresh()
    for shard in range(topo.n_shards):
        store.cluster.server_of_shard(topo, shard).run(
            admin(
                [
                    f"DELETE FROM {quote(topo.dbs[shard], 'entities')}"
                    f" WHERE {shard_is(topo, shard)}added_id % 3 = 0"
                ]
            )
        )
    store.declare_index(BY_LINK)
    cleaner = Cleaner(store, batch=40)
    assert cleaner.backfill("by_link") == "ready"
    assert cleaner.figures.as_dict()["rechecked"] == 0
    assert_clean(store)

    store.declare_index(Index("by_link2", {"link": "str(100)"}))
    # the first live entity of each logical shard: in its shard's first batch, so the
    # change below comes after the read of at least the batch that hit the failpoint
    firsts = [
        bytes(
            shard_rows(
                store, shard, "entities", "id", "body IS NOT NULL ORDER BY added_id LIMIT 1"
            )[0][0]
        )
        for shard in range(topo.n_shards)
    ]
    fired: list[bool] = []

    def change_firsts() -> None:
        if not fired:
            fired.append(True)
            for key in firsts:
                store.update(key, lambda e: {**(e or {}), "link": "http://changed/"})
            store.flush()

    failpoints.set("cleaner.after_read", change_firsts)
    cleaner = Cleaner(store, batch=40)
    assert cleaner.backfill("by_link2") == "ready"
    assert fired and cleaner.figures.as_dict()["rechecked"] >= 1
    for key in firsts:
        assert rows_of(store, BY_LINK, key) == {("http://changed/",): store.get(key).version}
    assert_clean(store)


# -- the race cases: a writer changes the entity between the Cleaner's read and write ------


def test_backfill_stale_read_leaves_no_stale_row(make_store: Any) -> None:
    store = make_store(shards=2)  # one batch per shard, one shard per server (lane)
    ids = load(store, 30)
    store.declare_index(BY_LINK)
    changed = ids[:5]
    deleted = ids[5:8]
    fired: list[bool] = []

    def writer_changes_them() -> None:
        fired.append(True)
        for i, key in enumerate(changed):
            store.update(key, lambda e, i=i: {**(e or {}), "link": f"http://now/{i}"})
        store.delete_many(deleted)
        store.flush()  # their step 3 done: what the Cleaner wrote from its read stays

    # both lanes have read their (only) batch when the writer changes the entities
    both_lanes_read = threading.Barrier(2, action=writer_changes_them, timeout=20)

    def current_rows_present() -> None:
        for i, key in enumerate(changed):
            assert (f"http://now/{i}",) in rows_of(store, BY_LINK, key)

    failpoints.set("cleaner.after_read", both_lanes_read.wait)
    failpoints.set("cleaner.before_delete", current_rows_present)
    failpoints.set("cleaner.after_batch", current_rows_present)
    cleaner = Cleaner(store, batch=1000)
    assert cleaner.backfill("by_link") == "ready"
    assert fired
    current_rows_present()
    for key in deleted:
        assert rows_of(store, BY_LINK, key) == {}
    assert cleaner.figures.as_dict()["orphans_deleted"] >= len(changed) + len(deleted)
    assert cleaner.figures.as_dict()["rechecked"] >= 1  # the proof saw the change
    assert_clean(store)


def test_backfill_recheck_leaves_no_row_of_a_body_replaced_meanwhile(make_store: Any) -> None:
    """The re-check reads a changed entity (an update's body, link L1 at version v1);
    a blind put (v2) then commits and its step 3 deletes L1's row before the
    reconciliation writes: the reconciliation must not write L1's row back (it did, at
    v1, an extra row that no later write of the entity removes)."""
    store = make_store(shards=2)  # one batch per shard, one shard per server (lane)
    ids = load(store, 30)
    store.declare_index(BY_LINK)
    key = ids[0]
    blind: list[int] = []

    def update_it() -> None:  # after both lanes' reads: the proof of key's batch fails
        store.update(key, lambda e: {**(e or {}), "link": "http://changed/L1"})
        store.flush()

    def blind_put() -> None:  # after the re-check read key at v1, before it writes
        if not blind:
            blind.append(store.put({"id": key, "link": "http://blind/"}))
            store.flush()  # its step 3 done: L1's row deleted

    failpoints.set("cleaner.after_read", threading.Barrier(2, action=update_it, timeout=20).wait)
    failpoints.set("cleaner.before_reconcile", blind_put)
    cleaner = Cleaner(store, batch=1000)
    assert cleaner.backfill("by_link") == "ready"
    failpoints.clear()
    assert blind and cleaner.figures.as_dict()["rechecked"] >= 1, cleaner.figures.as_dict()
    assert rows_of(store, BY_LINK, key) == {("http://blind/",): blind[0]}
    assert_clean(store)


def test_repair_stale_read_never_deletes_a_current_row(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    ids = load(store, 20)
    target = ids[3]
    version = store.get(target).version
    plant(store, BY_LINK, ("http://soon/b",), target, version)  # an orphan, for now
    fired: list[int] = []

    def writer_makes_it_current() -> None:
        if not fired:
            new = store.update(target, lambda e: {**(e or {}), "link": "http://soon/b"})
            fired.append(new.version)

    def row_b_survives() -> None:
        if fired:
            assert rows_of(store, BY_LINK, target).get(("http://soon/b",)) == fired[0]

    failpoints.set("cleaner.after_read", writer_makes_it_current)
    failpoints.set("cleaner.after_batch", row_b_survives)
    cleaner = Cleaner(store)
    cleaner.run_once()
    failpoints.clear()
    assert fired
    assert rows_of(store, BY_LINK, target) == {("http://soon/b",): fired[0]}
    assert_clean(store)


def test_stale_rows_of_an_abab_writer_vanish_on_the_next_pass(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    ids = load(store, 10)
    key = ids[0]
    v = store.get(key).version
    plant(store, BY_LINK, ("http://stale/1",), key, v)  # a step 3 that never ran
    plant(store, BY_LINK, ("http://stale/2",), key, v - 1)

    def writer_goes_a_b_a() -> None:
        failpoints.clear("cleaner.before_delete")
        store.update(key, lambda e: {**(e or {}), "link": "http://stale/1"})
        store.update(key, lambda e: {**(e or {}), "link": "http://example.com/0"})

    failpoints.set("cleaner.before_delete", writer_goes_a_b_a)
    Cleaner(store).run_once()
    current = store.get(key)
    assert current is not None
    assert rows_of(store, BY_LINK, key) == {("http://example.com/0",): current.version}
    assert_clean(store)


# -- orphans of writers that died between step 1 and step 2 ----------------------------------


def test_orphans_of_a_crashed_insert_are_fenced_then_removed(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK, BY_TAG])
    load(store, 20)
    crashed = {"id": new_id(), "link": "http://crashed", "tags": ["a", "b", "c", "d"], "n": 1}
    while not step1_rows(store, BY_LINK, crashed):  # an id whose link row is written alone
        crashed["id"] = new_id()
    orphan_id = crashed["id"]
    failpoints.set("put.after_index_rows", "raise")
    with pytest.raises(FailpointError):
        store.put(crashed)
    failpoints.clear()
    assert store.get(orphan_id) is None
    orphans = step1_rows(store, BY_LINK, crashed) | step1_rows(store, BY_TAG, crashed)
    assert set(rows_of(store, BY_LINK, orphan_id)) == step1_rows(store, BY_LINK, crashed)
    assert set(rows_of(store, BY_TAG, orphan_id)) == step1_rows(store, BY_TAG, crashed)

    cleaner = Cleaner(store)
    figures = cleaner.run_once()
    assert figures["fenced"] >= 1 and figures["orphans_deleted"] >= len(orphans)
    assert rows_of(store, BY_LINK, orphan_id) == {} and rows_of(store, BY_TAG, orphan_id) == {}
    topo = store.cluster.refresh()
    fence = read_entities(store, topo, [orphan_id])[orphan_id]
    assert fence.exists and fence.body is None  # a tombstone above the orphans' version
    assert_clean(store)
    # the id stays usable: a later put (blind, or create-only) goes above the tombstone
    version = store.put({"id": orphan_id, "link": "http://alive", "n": 2}, expect_version=0)
    assert version > fence.version
    assert rows_of(store, BY_LINK, orphan_id) == {("http://alive",): version}
    cleaner.run_once()
    assert_clean(store)


@pytest.mark.parametrize("how", ["put", "put_many", "create"])
def test_a_new_entity_fenced_in_flight_is_written_above_the_fence(
    make_store: Any, how: str
) -> None:
    """The Cleaner fences the rows of an absent entity at once (a writer in flight looks
    like one that died after step 1): a put of a new entity (its id made by the library)
    that meets the tombstone is written again above it, and so is every entity whose
    step 2 shared that server's rolled-back transaction; nothing is refused."""
    store = make_store(indexes=[BY_LINK, BY_TAG])
    load(store, 20)
    topo = store.cluster.refresh()
    servers = set()
    tags: list[str] = []
    while len(servers) < 2:  # rows on both servers: some go ahead in step 1, whatever the id
        tags.append(f"x{len(tags)}")
        row = (tags[-1], 1)
        servers.add(topo.shard_servers[shard_of(BY_TAG.shard_key(row), topo.n_shards)])
    first = {"link": "http://in-flight/0", "tags": tags, "n": 1}
    entities = [first] + [
        {"link": f"http://in-flight/{i}", "n": i} for i in range(1, 9 if how == "put_many" else 1)
    ]
    fired: list[dict[str, Any]] = []

    def cleaner_meets_step_1() -> None:
        if not fired:
            fired.append(Cleaner(store).run_once())

    failpoints.set("put.after_index_rows", cleaner_meets_step_1)
    if how == "put_many":
        versions = store.put_many(entities)
    else:  # create: only if the id is not taken (a tombstone does not count)
        versions = [store.put(first, expect_version=0 if how == "create" else None)]
    failpoints.clear()
    assert fired and fired[0]["fenced"] >= 1  # the fence was there before step 2
    for entity, version in zip(entities, versions, strict=True):
        got = store.get(entity["id"])
        assert got == entity and got.version == version
        assert [e["id"] for e in store.query("by_link", link=entity["link"])] == [entity["id"]]
    assert_clean(store)


def test_rows_ahead_of_a_live_entity_wait_for_fence_after(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    ids = load(store, 10)
    key = next(k for k in ids if step1_rows(store, BY_LINK, {"id": k, "link": "http://nc"}))
    failpoints.set("put.after_index_rows", "raise")
    with pytest.raises(FailpointError):
        store.put({"id": key, "link": "http://nc"})
    failpoints.clear()
    before = store.get(key)
    assert before is not None

    figures = Cleaner(store).run_once()  # the write might still be in flight: left alone
    assert figures["deferred"] >= 1
    assert ("http://nc",) in rows_of(store, BY_LINK, key)

    figures = Cleaner(store, fence_after=0).run_once()
    assert figures["fenced"] == 1
    after = store.get(key)
    assert after == before and after is not None and after.version > before.version
    assert rows_of(store, BY_LINK, key) == {(before["link"],): after.version}
    assert_clean(store)
    with pytest.raises(ConflictError):  # a writer still holding the old version loses
        store.put({"id": key, "link": "late"}, expect_version=before.version)


# -- the continuous pass: recent changes, sweep, purge ------------------------------------


def test_pass_repairs_missing_behind_and_extra_rows(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    ids = load(store, 50)
    topo = store.cluster.refresh()
    # a missing row (recent pass), a behind row, an orphan of a deleted entity (sweep)
    victim, behind, gone = ids[1], ids[2], ids[3]
    _delete_row(store, topo, BY_LINK, ("http://example.com/1",), victim)
    _set_version(store, topo, BY_LINK, ("http://example.com/2",), behind, 1)
    store.delete(gone)
    store.flush()  # its rows deleted, so the planted one is an orphan
    plant(store, BY_LINK, ("http://example.com/3",), gone, 1)
    figures = Cleaner(store).run_once()
    assert figures["rows_upserted"] >= 2 and figures["orphans_deleted"] >= 1
    assert_clean(store)
    checkpoints = store.cluster.catalog.checkpoints("recent")
    # a mark for every shard that holds an entity (50 random ids may leave one empty)
    assert set(checkpoints) == {shard_of(key, topo.n_shards) for key in ids}


def test_purge_of_old_tombstones(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    ids = load(store, 30)
    store.delete_many(ids[:10])
    cleaner = Cleaner(store, tombstone_retention=3600)
    assert cleaner.run_once()["purged"] == 0
    assert cleaner.run_once(now=time.time() + 7200)["purged"] == 10
    topo = store.cluster.refresh()
    assert all(not e.exists for e in read_entities(store, topo, ids[:10]).values())
    assert_clean(store)


def test_a_tombstone_purged_during_a_pass_never_costs_a_recreated_entity_its_rows(
    make_store: Any,
) -> None:
    """The orphan row of a deleted entity is read with its tombstone; before the delete,
    another Cleaner purges the tombstone and the id is created again at version 1."""
    store = make_store(indexes=[BY_LINK])
    key = load(store, 1)[0]
    store.delete(key)
    store.flush()
    plant(store, BY_LINK, ("http://example.com/0",), key, 1)  # step 3 of the delete died
    cleaner = Cleaner(store, tombstone_retention=3600)

    def purge_and_create() -> None:
        failpoints.clear("cleaner.before_delete")
        assert (
            Cleaner(store, tombstone_retention=3600).run_once(now=time.time() + 7200)["purged"] == 1
        )
        assert store.put({"id": key, "link": "http://example.com/0"}, expect_version=0) == 1

    failpoints.set("cleaner.before_delete", purge_and_create)
    cleaner.run_once()
    assert store.get(key) == {"id": key, "link": "http://example.com/0"}
    assert rows_of(store, BY_LINK, key) == {("http://example.com/0",): 1}
    assert [e["id"] for e in store.query(BY_LINK, link="http://example.com/0")] == [key]
    assert_clean(store)


def test_continuous_sweep_advances_in_slices(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    load(store, 200)
    cleaner = Cleaner(store, batch=20, sweep_budget=40, interval=0)
    cleaner.run_once(full=False)
    cursors = store.cluster.catalog.cursors("sweep:by_link")
    assert cursors and max(p for p, _, _, _ in cursors.values()) == 1
    assert not all(done for _, _, done, _ in cursors.values())
    checked = cleaner.figures.as_dict()["rows_checked"]
    for _ in range(12):
        cleaner.run_once(full=False)
    cursors = store.cluster.catalog.cursors("sweep:by_link")
    assert max(p for p, _, _, _ in cursors.values()) >= 2  # a round completed, a new one began
    assert cleaner.figures.as_dict()["rows_checked"] > checked


def test_run_forever_stops_on_request(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    load(store, 20)
    shutdown = Shutdown()
    cleaner = Cleaner(store, interval=0.05, shutdown=shutdown)
    passes: list[int] = []

    def count_and_stop() -> None:
        passes.append(1)
        if len(passes) >= 20:
            shutdown.request()

    failpoints.set("cleaner.after_batch", count_and_stop)
    cleaner.run_forever()
    assert cleaner.figures.as_dict()["state"] == "stopped"
    assert cleaner.figures.as_dict()["passes"] >= 1


def test_backs_off_while_a_server_is_unavailable_then_carries_on(
    make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    load(store, 100)
    store.declare_index(BY_LINK)
    outages = [3]

    def server_down() -> None:
        if outages[0]:
            outages[0] -= 1
            raise ShardUnavailable("server unavailable: 127.0.0.1:1 (injected)")

    failpoints.set("cleaner.after_read", server_down)
    caplog.set_level("INFO", logger="schemaless.cleaner")
    cleaner = Cleaner(store, backoff_cap=0.05)
    assert cleaner.backfill("by_link") == "ready"
    assert cleaner.figures.as_dict()["backoffs"] == 3
    assert "retrying in" in caplog.text and "available again" in caplog.text
    assert_clean(store)


def test_a_missing_table_without_a_move_stops_the_job(make_store: Any) -> None:
    """ "Table doesn't exist" is retried only when the map changed or a move is recorded;
    otherwise (here even the catalog is gone) it stops the job as it is."""
    store = make_store()
    topo = store.cluster.refresh()
    server = store.cluster.server_of_shard(topo, 0)
    catalog = store.cluster.catalog
    rt = Cleaner(store, backoff_cap=0.05).rt

    def missing() -> Any:
        return server.run(admin([f"SELECT 1 FROM {quote(topo.dbs[0], 'no_such_table')}"]))

    with pytest.raises(TableMissing):
        rt.retry("reading a table that is not there", missing)
    catalog.server.run(f"RENAME TABLE {quote(catalog.db, 'meta')} TO {quote(catalog.db, 'gone')}")
    try:
        with pytest.raises(TableMissing):  # the catalog's reload fails too: no loop
            rt.retry("reading a table that is not there", missing)
    finally:
        catalog.server.run(
            f"RENAME TABLE {quote(catalog.db, 'gone')} TO {quote(catalog.db, 'meta')}"
        )


def test_a_long_wait_for_a_move_says_what_ends_it(
    make_store: Any, caplog: Any, monkeypatch: Any
) -> None:
    """A job that meets a moving shard waits for its move; if the mover died, nothing
    ends the wait but a command: after a while the log names the move and both commands
    (it said "waiting" once, then nothing, found in a new user's trial)."""
    store = make_store()
    topo = store.cluster.refresh()
    store.cluster.catalog.record_move(0, topo.shard_servers[0], 1, "fenced")
    monkeypatch.setattr(runtime, "_STILL_MOVING", 3)
    rt = Cleaner(store, backoff_cap=0.05).rt
    tries = []

    def missing() -> int:
        tries.append(1)
        if len(tries) < 5:
            raise TableMissing("a logical shard named is not on this server (moved)")
        return len(tries)

    caplog.set_level("INFO", logger="schemaless.cleaner")
    try:
        assert rt.retry("reading shard 0", missing) == 5
    finally:
        store.cluster.catalog.cancel_move(0)
    hint = "`schemaless shards move 0 --to 1` finishes it, `schemaless shards rollback 0`"
    assert "waiting for the move of logical shard(s) 0" in caplog.text
    assert "reading shard 0: still waiting: shard 0: move " in caplog.text, caplog.text
    assert hint in caplog.text, caplog.text


def test_rate_limit_paces_the_pass(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    load(store, 300)
    started = time.monotonic()
    Cleaner(store, batch=100).run_once()
    fast = time.monotonic() - started
    started = time.monotonic()
    figures = Cleaner(store, batch=100, rate=500).run_once()
    paced = time.monotonic() - started
    # 300 entities + 300 rows (recent) + 300 rows (sweep), 500 of them free (the burst)
    assert figures["rows_checked"] == 900
    assert paced >= 0.7 and paced > fast


# -- reporting -----------------------------------------------------------------------


def test_heartbeat_figures_in_the_catalog(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    load(store, 20)
    cleaner = Cleaner(store, name="cleaner:test:1")
    cleaner.run_once()
    beat, figures = store.cluster.catalog.statuses()["cleaner:test:1"]
    assert beat > 0
    for key in (
        "last_pass",
        "rows_checked",
        "orphans_deleted",
        "rows_backfilled",
        "rows_upserted",
        "unindexable",
        "corrupt",
        "backlog",
        "state",
    ):
        assert key in figures
    assert figures["state"] == "idle" and figures["rows_checked"] > 0


def test_metrics_endpoint(make_store: Any) -> None:
    store = make_store(indexes=[BY_LINK])
    cleaner = Cleaner(store, name="cleaner:test:2")
    port = cleaner.serve_metrics(0)
    sick = store.cluster.servers()[0].health
    try:
        cleaner.run_once()
        sick.down("marked by the test")  # as after a timeout (no probe: the test clears it)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        sick.up()
        cleaner.close()
    assert "# TYPE schemaless_cleaner_rows_checked_total counter" in text
    assert 'schemaless_cleaner_passes_total{name="cleaner:test:2"} 1' in text
    assert 'schemaless_cleaner_servers_down{name="cleaner:test:2"} 1' in text
    assert 'schemaless_cleaner_server_downs_total{name="cleaner:test:2"} 1' in text


def test_progress_on_a_terminal_and_in_logs(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    out = io.StringIO()
    progress = Progress(out, tty=True, clock=lambda: clock[0])
    progress.update("by_link", 0, 1000, 0, 8)
    clock[0] = 2.0
    progress.update("by_link", 500, 1000, 4, 8)
    progress.close()
    text = out.getvalue()
    assert "\r" in text and text.endswith("\n")
    assert "by_link: 500/~1,000 rows, 250 rows/s, ETA 2s, shards 4/8" in text

    caplog.set_level("INFO", logger="schemaless.cleaner")
    logged = Progress(io.StringIO(), tty=False, interval=5, clock=lambda: clock[0])
    logged.update("recent", 10)
    clock[0] = 3.0
    logged.update("recent", 20)  # within the interval: no line
    clock[0] = 8.0
    logged.update("recent", 30)
    lines = [r.getMessage() for r in caplog.records if "progress" in r.getMessage()]
    assert len(lines) == 2 and "recent: 30 rows" in lines[-1]


def test_a_log_line_on_the_terminal_starts_after_the_progress_line() -> None:
    """The cleaner's console handler ends the progress line before a record (a user's
    trial saw "... 102.9 ms2026-11-28 03:22:56,0 INFO ... now ready")."""
    out = io.StringIO()
    progress = Progress(out, tty=True, clock=lambda: 1.0)
    handler = logging.StreamHandler(out)
    handler.addFilter(end_progress_lines)
    logger = logging.getLogger("schemaless.test_progress_lines")
    logger.addHandler(handler)
    try:
        progress.update("by_link", 10, 100, 1, 8)
        logger.warning("backfilled: now ready")
        progress.update("by_link", 20, 100, 2, 8)
        progress.close()
    finally:
        logger.removeHandler(handler)
    lines = out.getvalue().split("\n")
    assert lines[0].startswith("\rby_link: 10/") and lines[1] == "backfilled: now ready"
    assert lines[2].startswith("\rby_link: 20/") and lines[3] == ""


def test_token_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(100, burst=100, clock=lambda: now[0])
    assert bucket.reserve(100) == 0
    assert bucket.reserve(50) == pytest.approx(0.5)
    now[0] = 1.5
    assert bucket.reserve(100) == 0


# -- helpers ---------------------------------------------------------------------------


def _where(index: Index) -> str:
    return " AND ".join(f"{quote(c)} = %s" for c in (*index.columns, "entity_id"))


def _table(topo: Topology, index: Index, values: tuple[Any, ...]) -> tuple[int, str]:
    shard = shard_of(index.shard_key(values), topo.n_shards)
    return shard, quote(topo.dbs[shard], index.table)


def _delete_row(
    store: DataStore, topo: Topology, index: Index, values: tuple[Any, ...], key: bytes
) -> None:
    shard, table = _table(topo, index, values)
    store.cluster.server_of_shard(topo, shard).run(
        admin([f"DELETE FROM {table} WHERE {_where(index)}"]), [*values, key]
    )


def _set_version(
    store: DataStore,
    topo: Topology,
    index: Index,
    values: tuple[Any, ...],
    key: bytes,
    version: int,
) -> None:
    shard, table = _table(topo, index, values)
    store.cluster.server_of_shard(topo, shard).run(
        admin([f"UPDATE {table} SET entity_version = %s WHERE {_where(index)}"]),
        [version, *values, key],
    )
