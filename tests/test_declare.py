"""Declaring an index over live data is safe: ``declare_index`` and ``index create``
refuse data that does not fit (unless forced); a write never fails because of a
building index, it blocks the build instead; the backfill's ready transition is a
compare-and-set against those blocks (docs/architecture.md, "Declaring an index over
data that does not fit")."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from conftest import assert_clean
from test_unique import Pause, racer

from schemaless import DataStore, Index, IndexDoesNotFit, failpoints
from schemaless.cleaner import Cleaner
from schemaless.errors import InvalidEntity, UniqueViolation
from schemaless.fit import Fit
from schemaless.ids import id_hex

BY_TITLE = Index("by_title", {"title": "str(8)"})
BY_NAME = Index("by_name", {"name": "str(32)"}, unique=True)


def titled(store: DataStore, long: int = 3, short: int = 20) -> list[dict[str, Any]]:
    """Entities with short titles and ``long`` ones of 10 characters; all of them."""
    entities = [{"title": f"t{i}", "n": i} for i in range(short)]
    entities += [{"title": f"long-{i:05d}", "n": i} for i in range(long)]
    store.put_many(entities)
    return entities


def blocks(store: DataStore, name: str) -> tuple[int, int]:
    """(writes that blocked the index, entities its backfill set aside)."""
    (writes, _), unfit = store.cluster.catalog.blocks(name)
    return writes, sum(count for count, _ in unfit.values())


def state(store: DataStore, name: str) -> str:
    return store.cluster.refresh().indexes[name].state


# -- pure ---------------------------------------------------------------------------------


def test_fit_counts_misfits_and_repeats_with_examples() -> None:
    found = Fit(Index("by_name", {"name": "str(4)"}, unique=True))
    assert found.add(b"\1" * 16, 3, {"name": "ada"}) == {("ada",)}
    assert found.add(b"\2" * 16, 4, {"name": "ada"}) == {("ada",)}
    assert found.add(b"\3" * 16, 5, {"name": "toolong"}) is None
    assert found.add(b"\4" * 16, 5, {"other": 1}) == set()
    assert (found.checked, found.unfit, found.repeated, found.fits) == (4, 1, 1, False)
    first = id_hex(b"\1" * 16)
    assert found.repeat_examples == [
        (id_hex(b"\2" * 16), 4, f"name='ada' is also the value of entity {first}")
    ]
    assert found.unfit_examples[0][:2] == (id_hex(b"\3" * 16), 5)
    summary = found.summary()
    assert "of 4 sampled, 1 have a value that does not fit" in summary
    assert "1 share a value of the unique index" in summary and "force" in summary
    assert len(found.examples()) == 2 and "\n" not in summary
    assert Fit(BY_TITLE).fits


# -- declaring ----------------------------------------------------------------------------


def test_declaring_over_misfits_is_refused_unless_forced(
    make_store: Callable[..., DataStore], local_cluster: Any
) -> None:
    store = make_store()
    entities = titled(store)
    with pytest.raises(IndexDoesNotFit) as refused:
        store.declare_index(BY_TITLE)
    text = str(refused.value)
    assert "of 23 sampled, 3 have a value that does not fit" in text
    longs = {id_hex(e["id"]) for e in entities if len(e["title"]) > 8}
    assert sum(key in text for key in longs) == 3  # every example named
    assert "by_title" not in store.cluster.refresh().indexes  # nothing declared
    prefix = store.cluster.topology.prefix
    with pytest.raises(IndexDoesNotFit):  # the README's form refuses it too
        DataStore(
            local_cluster.addresses,
            [BY_TITLE],
            prefix=prefix,
            option_file=str(local_cluster.option_file),
        )
    with DataStore(
        local_cluster.addresses,
        [BY_TITLE],
        prefix=prefix,
        option_file=str(local_cluster.option_file),
        force_indexes=True,
    ) as forced:
        assert forced.indexes()["by_title"].state == "building"
    assert store.declare_index(BY_TITLE) == "building"  # known now: no check


def test_a_unique_index_over_duplicates_is_refused_unless_forced(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store()
    store.put_many([{"name": "twin"}, {"name": "twin"}, {"name": "solo"}])
    with pytest.raises(IndexDoesNotFit, match="1 share a value of the unique index"):
        store.declare_index(BY_NAME)
    assert store.declare_index(BY_NAME, force=True) == "building"


def test_an_index_that_fits_is_declared_without_force(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store()
    titled(store, long=0)
    assert store.declare_index(BY_TITLE) == "building"
    assert Cleaner(store).backfill("by_title") == "ready"


# -- writes while building ------------------------------------------------------------------


def test_misfits_block_the_build_and_never_fail_a_write(
    make_store: Callable[..., DataStore],
) -> None:
    """Forced over misfits: updates that do not touch the title, and puts of new
    misfits, succeed (no row); the backfill leaves the index building and says why;
    fixed data and a second backfill make it ready and exact; then misfits fail."""
    store = make_store()
    entities = titled(store)
    store.declare_index(BY_TITLE, force=True)
    old = next(e for e in entities if len(e["title"]) > 8)
    assert store.update(old["id"], lambda e: {**(e or {}), "n": 99})["n"] == 99
    fresh = {"title": "new-long-title"}
    store.put(fresh)
    assert blocks(store, "by_title") == (1, 0)  # once per process and index epoch
    assert Cleaner(store).backfill("by_title") == "building"
    assert blocks(store, "by_title") == (0, 4)  # reopened; the 3 old ones and the new one
    # fix: shorten every long title
    for e in [*entities, fresh]:
        if len(e["title"]) > 8:
            store.update(e["id"], lambda x: {**(x or {}), "title": x["title"][-8:]})
    assert Cleaner(store).backfill("by_title") == "ready"
    assert blocks(store, "by_title") == (0, 0)
    store.cluster.refresh()
    assert len(store.query("by_title", title=old["title"][-8:])) == 1
    assert_clean(store)
    with pytest.raises(InvalidEntity, match="longer than str"):  # ready: refused
        store.put({"title": "long-again"})


def test_duplicates_block_a_unique_build_and_never_fail_a_write(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store()
    twins = [{"name": "twin", "n": 1}, {"name": "twin", "n": 2}, {"name": "solo"}]
    store.put_many(twins)
    store.declare_index(BY_NAME, force=True)
    for twin in twins[:2]:  # updates that do not touch the name
        assert store.update(twin["id"], lambda e: {**(e or {}), "n": 7})["n"] == 7
    third = {"name": "solo"}
    store.put(third)  # another owner's value, while building: written, no row
    assert store.get(third["id"])["name"] == "solo"
    assert blocks(store, "by_name")[0] >= 1
    assert Cleaner(store).backfill("by_name") == "building"
    store.delete_many([twins[1]["id"], third["id"]])
    assert Cleaner(store).backfill("by_name") == "ready"
    store.cluster.refresh()
    assert store.get_by("by_name", name="twin")["id"] == twins[0]["id"]
    with pytest.raises(UniqueViolation):  # ready: enforced
        store.put({"name": "solo"})
    assert_clean(store)


def test_two_entities_of_one_put_many_sharing_a_building_unique_value(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store()
    store.put({"name": "a"})
    store.declare_index(BY_NAME)
    pair = [{"name": "b"}, {"name": "b"}]
    store.put_many(pair)  # building: both written, the build blocked
    assert [store.get(e["id"])["name"] for e in pair] == ["b", "b"]
    assert blocks(store, "by_name")[0] == 1
    assert Cleaner(store).backfill("by_name") == "building"


# -- the race between a block and the ready transition ------------------------------------


def test_a_block_before_the_ready_transition_keeps_the_index_building(
    make_store: Callable[..., DataStore],
) -> None:
    """The backfill stops just before its ready transition; a write blocks the index
    and is written meanwhile: the compare-and-set fails, the index stays building."""
    store = make_store()
    titled(store, long=0)
    store.declare_index(BY_TITLE)
    pause = Pause("cleaner")
    failpoints.set("cleaner.after_entity_key", pause)
    out: dict[str, Any] = {}
    cleaner = racer("cleaner", lambda: Cleaner(store).backfill("by_title"), out)
    assert pause.reached.wait(30)
    entity: dict[str, Any] = {"title": "far-too-long"}
    store.put(entity)
    pause.release()
    cleaner.join(30)
    assert out["cleaner"] == "building"
    assert state(store, "by_title") == "building"
    assert store.get(entity["id"])["title"] == "far-too-long"


def test_a_block_after_the_ready_transition_refuses_the_write(
    make_store: Callable[..., DataStore],
) -> None:
    """The writer read a map in which the index is building, and stops before it
    blocks it; the backfill makes it ready meanwhile: the block finds it ready, and
    the write is refused as for a ready index (nothing written)."""
    store = make_store()
    titled(store, long=0)
    store.declare_index(BY_TITLE)
    pause = Pause("writer")
    failpoints.set("put.before_block", pause)
    out: dict[str, Any] = {}
    entity: dict[str, Any] = {"title": "far-too-long"}
    writer = racer("writer", lambda: store.put(entity), out)
    assert pause.reached.wait(30)
    assert Cleaner(store).backfill("by_title") == "ready"
    pause.release()
    writer.join(30)
    assert isinstance(out["writer"], InvalidEntity), out["writer"]
    assert store.get(entity["id"]) is None
    assert blocks(store, "by_title") == (0, 0)
    assert_clean(store)


def test_a_write_that_blocked_before_a_rescan_and_commits_after_it(
    make_store: Callable[..., DataStore],
) -> None:
    """A write blocks the index and stops before its entity; a backfill reopens the
    index (a new index epoch: the blocks forgotten, the old fences dropped), rescans
    and makes it ready; the write then meets the dropped fence and writes again on
    the new map, where the index is ready: refused, and the index stays exact."""
    store = make_store()
    titled(store, long=0)
    store.declare_index(BY_TITLE)
    pause = Pause("writer")
    failpoints.set("put.after_block", pause)
    out: dict[str, Any] = {}
    entity: dict[str, Any] = {"title": "far-too-long"}
    writer = racer("writer", lambda: store.put(entity), out)
    assert pause.reached.wait(30)
    assert blocks(store, "by_title") == (1, 0)
    assert Cleaner(store).backfill("by_title") == "ready"  # reopened, rescanned
    pause.release()
    writer.join(30)
    assert isinstance(out["writer"], InvalidEntity), out["writer"]
    assert store.get(entity["id"]) is None
    assert_clean(store)


def test_a_concurrent_writer_keeps_every_acknowledged_write(
    make_store: Callable[..., DataStore],
) -> None:
    """While a backfill runs over an index forced over misfits, a writer puts new
    entities and updates old ones (titles that fit or not, or other properties):
    every acknowledged write is stored; fixed, the index becomes ready and exact."""
    store = make_store()
    entities = titled(store, long=20, short=200)
    store.declare_index(BY_TITLE, force=True)
    acked: dict[bytes, dict[str, Any]] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        rnd = random.Random(7)
        ids = [e["id"] for e in entities]
        try:
            while not stop.is_set():
                title = rnd.choice(["ok", "long-title-here", None])
                if rnd.random() < 0.3:
                    new: dict[str, Any] = {"title": title or "x", "n": -1}
                    store.put(new)
                    ids.append(new["id"])
                    acked[new["id"]] = new
                    continue
                key = rnd.choice(ids)

                def change(e: Any, title: str | None = title) -> dict[str, Any]:
                    return {**e, "title": title} if title else {**e, "n": e["n"] + 1}

                acked[key] = dict(store.update(key, change))
        except BaseException as exc:  # the test fails on it below
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        assert Cleaner(store, batch=16).backfill("by_title") == "building"
    finally:
        stop.set()
        thread.join(30)
    assert errors == []
    assert len(acked) > 10
    for key, value in acked.items():
        assert dict(store.get(key)) == value
    for key in {*acked, *(e["id"] for e in entities)}:
        current = store.get(key)
        if current is not None and len(current["title"]) > 8:
            store.update(key, lambda x: {**x, "title": x["title"][:8]})
    assert Cleaner(store).backfill("by_title") == "ready"
    assert_clean(store)


# -- the command line ---------------------------------------------------------------------


def test_cli_create_refuses_misfits_and_duplicates_and_status_says_why(
    make_store: Callable[..., DataStore], local_cluster: Any
) -> None:
    from test_cli import Cli, cluster_env

    store = make_store()
    entities = titled(store, long=2)
    store.put_many([{"name": "twin"}, {"name": "twin"}])
    run = Cli(cluster_env(local_cluster, store.cluster.topology.prefix))
    line = run.fails("index", "create", "by_title", "--property", "title:str(8)")
    assert "2 have a value that does not fit" in line and "--force" in line
    shown = run("index", "create", "by_title", "--property", "title:str(8)").output
    longs = [id_hex(e["id"]) for e in entities if len(e["title"]) > 8]
    assert all(key in shown for key in longs)
    line = run.fails("index", "create", "by_name", "--property", "name:str(8)", "--unique")
    assert "1 share a value of the unique index" in line
    dry = run.ok(
        "index", "create", "by_name", "--property", "name:str(8)", "--unique", "--dry-run"
    ).output
    assert "duplicates   1 sampled entities share a value" in dry
    assert (
        "is building"
        in run.ok("index", "create", "by_title", "--property", "title:str(8)", "--force").output
    )
    assert "by_name" not in store.cluster.refresh().indexes
    assert Cleaner(store).backfill("by_title") == "building"
    store.cluster.refresh()
    fresh = {"title": "a-long-new-title"}
    store.put(fresh)
    status = run.ok("index", "status", "by_title").output
    assert "blocked: it cannot become ready: writes met it" in status, status
    assert "1 recorded, once per client process" in status
    assert "entity " + id_hex(fresh["id"]) + ": property 'title'" in status
    assert "2 entities set aside by the backfill" in status
    assert all(key in status for key in longs) and "--index=by_title" in status
    report = json.loads(run.ok("index", "status", "by_title", "--json").output)
    assert (report["blocked"]["writes"], report["blocked"]["unfit"]) == (1, 2)


def test_cleaner_jobs_reopens_a_blocked_index_before_its_parts(
    make_store: Callable[..., DataStore], local_cluster: Any
) -> None:
    """``cleaner --jobs 2`` over a blocked index: it stays building while a misfit is
    stored; fixed, the supervisor reopens it, the parts rescan, and it becomes ready."""
    from test_cleaner_cli import cluster_env, invoke

    store = make_store()
    entities = titled(store, long=1, short=60)
    store.declare_index(BY_TITLE, force=True)
    env = cluster_env(local_cluster, store)
    first = invoke(env, "--index", "by_title", "--jobs", "2")
    assert first.exit_code == 1 and "index status by_title` says why" in first.output
    assert blocks(store, "by_title") == (0, 1)
    (long,) = [e for e in entities if len(e["title"]) > 8]
    store.update(long["id"], lambda e: {**e, "title": "short"})
    second = invoke(env, "--index", "by_title", "--jobs", "2")
    assert second.exit_code == 0, second.output
    assert state(store, "by_title") == "ready" and blocks(store, "by_title") == (0, 0)
    assert_clean(store)
