"""Unique indexes (docs/architecture.md, "Unique indexes"): claims, violations,
orphans taken over, owners in flight fenced, racers paused at every step."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from conftest import assert_clean, shard_rows

from schemaless import (
    ConflictError,
    DataStore,
    Index,
    InvalidQuery,
    TableMissing,
    UniqueViolation,
    failpoints,
    new_id,
)
from schemaless.catalog import now_us
from schemaless.hashing import shard_of
from schemaless.names import quote
from schemaless.owned import UNCHECKED, admin
from schemaless.writes import fence_owner_sql

BY_NAME = Index("by_name", {"name": "str(64)"}, unique=True)


def owners(store: DataStore, index: str = "by_name") -> dict[Any, bytes]:
    """Every row of a unique index: values -> entity_id (brute force, every shard)."""
    topo = store.cluster.refresh()
    info = topo.indexes[index].index
    out: dict[Any, bytes] = {}
    cols = ", ".join(quote(c) for c in info.columns)
    for shard in range(topo.n_shards):
        for row in shard_rows(store, shard, info.table, f"{cols}, `entity_id`"):
            assert row[:-1] not in out
            out[row[:-1]] = bytes(row[-1])
    return out


def live_by_value(store: DataStore, prop: str = "name") -> dict[Any, list[bytes]]:
    """The oracle: every live entity, decoded, grouped by its value."""
    topo = store.cluster.refresh()
    out: dict[Any, list[bytes]] = {}
    for shard in range(topo.n_shards):
        for key, version, body in shard_rows(store, shard, "entities", "`id`, `version`, `body`"):
            if body is not None:
                entity = store.decode(bytes(key), shard, version, bytes(body))
                if entity.get(prop) is not None:
                    out.setdefault(entity[prop], []).append(bytes(key))
    return out


def test_a_value_has_one_owner(make_store: Callable[..., DataStore]) -> None:
    store = make_store([BY_NAME])
    ada = {"name": "ada", "n": 1}
    store.put(ada)
    with pytest.raises(UniqueViolation) as caught:
        store.put({"name": "ada", "n": 2})
    assert caught.value.index == "by_name" and caught.value.values == ("ada",)
    assert "ada" in str(caught.value) and "'n'" not in str(caught.value)
    assert isinstance(caught.value, ConflictError)
    assert store.put({**ada, "n": 3}) > 0  # an update that keeps its value goes on
    assert store.get_by("by_name", name="ada") == {**ada, "n": 3}
    assert BY_NAME.get(store, name="ada")["id"] == ada["id"]
    assert BY_NAME.get(store, name="bob") is None
    assert list(live_by_value(store)) == ["ada"]
    store.flush()
    assert_clean(store)
    assert owners(store) == {("ada",): ada["id"]}


def test_a_value_freed_by_a_delete_or_a_rename_is_claimable_at_once(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store([BY_NAME])
    ada = {"name": "ada"}
    store.put(ada)
    store.put({"id": ada["id"], "name": "ada2"})  # a rename frees "ada"
    bob = {"name": "ada"}
    store.put(bob)
    store.delete(bob["id"])  # a delete frees it again
    carl = {"name": "ada"}
    store.put(carl)
    assert store.get_by("by_name", name="ada")["id"] == carl["id"]
    store.update(ada["id"], lambda e: {**(e or {}), "name": "carl"})
    with pytest.raises(UniqueViolation):
        store.update(ada["id"], lambda e: {**(e or {}), "name": "ada"})
    assert store.get(ada["id"])["name"] == "carl"
    store.flush()
    assert_clean(store)


@pytest.mark.parametrize("layout", ["owned", "databases"])
def test_claims_takeovers_fences_and_releases_in_either_layout(
    make_store: Callable[..., DataStore], layout: str
) -> None:
    """Without the Cleaner: a violation, an orphan taken over, an owner in flight
    fenced (a tombstone written on its shard) and a refused new entity's claims
    released, in the owned layout and in the layout of a database per shard."""
    store = make_store([BY_NAME], layout=layout, claim_wait=0.05)
    assert (store.cluster.topology.owned_db is None) == (layout == "databases")
    ada = {"name": "ada"}
    store.put(ada)
    with pytest.raises(UniqueViolation):
        store.put({"name": "ada"})
    store.put({"id": ada["id"], "name": "ada2"})  # leaves "ada" an orphan
    bob = {"name": "ada"}
    store.put(bob)  # takes it over
    dead = {"name": "x"}
    failpoints.set("put.after_index_rows", "raise")
    with pytest.raises(failpoints.FailpointError):
        store.put(dead)  # a claim ahead of its entity
    failpoints.clear()
    carl = {"name": "x"}
    store.put(carl)  # waits, fences the dead claimer, takes the row over
    shard = store.cluster.shard_of_id(dead["id"])
    fenced = shard_rows(store, shard, "entities", "`body`", "`id` = %s", (dead["id"],))
    assert fenced == [(None,)]  # a tombstone, on the dead claimer's shard
    with pytest.raises(UniqueViolation):
        store.put_many([{"name": "y"}, {"name": "x"}])
    assert owners(store) == {("ada",): bob["id"], ("ada2",): ada["id"], ("x",): carl["id"]}
    assert store.get_by("by_name", name="x")["id"] == carl["id"]


def place(name: str, n_shards: int) -> int:
    """The logical shard of ``BY_NAME``'s row of a name."""
    return shard_of(BY_NAME.shard_key((name,)), n_shards)


def test_a_claim_or_a_fence_on_a_shard_not_owned_writes_nothing(
    make_store: Callable[..., DataStore],
) -> None:
    """The owned layout: a server that gave a value's logical shard away refuses the
    claim (its upsert's insert trigger, even for a row it would leave as it is) and an
    owner's fence there (the tombstone's ``INSERT IGNORE``: IGNORE does not silence
    the trigger): ``TableMissing``, nothing written."""
    store = make_store([BY_NAME], shards=4)
    store.put({"name": "ada"})
    topo = store.cluster.refresh()
    db = str(topo.owned_db)
    shard = place("ada", topo.n_shards)
    server = store.cluster.server_of_shard(topo, shard)
    owner = next(k for k in iter(new_id, None) if store.cluster.shard_of_id(k) == shard)
    fresh = next(n for n in map(str, range(1000)) if place(n, topo.n_shards) == shard)
    before = shard_rows(store, shard, BY_NAME.table, "`entity_id`, `entity_version`")
    server.run(admin([f"{UNCHECKED}DELETE FROM {quote(db, 'owned')} WHERE `shard` = {shard}"]))
    try:
        for name in (fresh, "ada"):  # a new claim, and one meeting a row it leaves as is
            with pytest.raises(TableMissing):
                store.put({"name": name})
        sql, params = fence_owner_sql(db, owner, None, 5, now_us(), shard)
        with pytest.raises(TableMissing):
            server.run(admin([sql]), params)
    finally:
        server.run(admin([f"INSERT INTO {quote(db, 'owned')} (`shard`) VALUES ({shard})"]))
    assert shard_rows(store, shard, BY_NAME.table, "`entity_id`, `entity_version`") == before
    assert shard_rows(store, shard, "entities", "`id`", "`id` = %s", (owner,)) == []


def test_put_many_with_two_entities_claiming_one_value_writes_nothing(
    make_store: Callable[..., DataStore],
) -> None:
    store = make_store([BY_NAME])
    batch = [{"name": "x"}, {"name": "y"}, {"name": "x"}]
    with pytest.raises(UniqueViolation, match="both have name='x'"):
        store.put_many(batch)
    assert live_by_value(store) == {}
    store.put({"name": "z"})
    with pytest.raises(UniqueViolation):
        store.put_many([{"name": "w"}, {"name": "z"}])
    assert sorted(live_by_value(store)) == ["z"]
    assert sorted(owners(store)) == [("z",)]  # the refused new entities' claims released


def test_get_by_refuses_what_is_not_one_value_of_a_unique_index(
    make_store: Callable[..., DataStore],
) -> None:
    plain = Index("by_n", ["n"])
    pair = Index("by_pair", {"a": "int", "b": "str(8)"}, unique=True)
    store = make_store([BY_NAME, plain, pair])
    with pytest.raises(InvalidQuery, match="not unique"):
        store.get_by("by_n", n=1)
    with pytest.raises(InvalidQuery, match="exactly its properties"):
        store.get_by("by_pair", a=1)
    e = {"a": 1, "b": "x"}
    store.put(e)
    store.put({"a": 1, "b": "y"})
    with pytest.raises(UniqueViolation, match="a=1, b='x'"):
        store.put({"a": 1, "b": "x"})
    assert pair.get(store, a=1, b="x")["id"] == e["id"]


class Pause:
    """A failpoint action that stops the thread named ``who`` the first time it gets
    there, until ``release()``."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.reached = threading.Event()
        self.go = threading.Event()
        self.hits = 0

    def __call__(self) -> None:
        if threading.current_thread().name != self.who or self.hits:
            return
        self.hits += 1
        self.reached.set()
        assert self.go.wait(30)

    def release(self) -> None:
        self.go.set()


def racer(name: str, fn: Callable[[], Any], out: dict[str, Any]) -> threading.Thread:
    """Run ``fn`` in a thread called ``name``; its result or exception lands in ``out``."""

    def run() -> None:
        try:
            out[name] = fn()
        except Exception as exc:  # the test asserts which one
            out[name] = exc

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def settled(store: DataStore) -> None:
    """One Cleaner pass, then the oracle: every index exact, one live owner per value
    and the unique row names it."""
    from schemaless.cleaner import Cleaner

    store.flush()
    Cleaner(store).run_once()
    assert_clean(store)
    live = live_by_value(store)
    assert all(len(ids) == 1 for ids in live.values()), live
    assert owners(store) == {(name,): ids[0] for name, ids in live.items()}


@pytest.mark.parametrize("paused", ["new", "rename"])
@pytest.mark.parametrize("pause_outlasts_the_wait", [False, True])
def test_two_claimers_in_flight_resolve_to_one_winner(
    make_store: Callable[..., DataStore], paused: str, pause_outlasts_the_wait: bool
) -> None:
    """One racer stops between its steps 1 and 2 (``put.after_index_rows``), the other
    claims the same value.  A short pause: the second waits and sees the first live
    (a violation).  A long one: the second fences the first and wins; the first's step
    2 is refused, it writes again and meets the winner (a violation)."""
    store = make_store([BY_NAME], claim_wait=0.5)
    renamed = {"name": "before"}
    store.put(renamed)
    other = "rename" if paused == "new" else "new"
    run = {
        "new": lambda: store.put({"name": "x"}),
        "rename": lambda: store.update(renamed["id"], lambda e: {**(e or {}), "name": "x"}),
    }
    pause = Pause(paused)
    failpoints.set("put.after_index_rows", pause)
    out: dict[str, Any] = {}
    first = racer(paused, run[paused], out)
    assert pause.reached.wait(30)
    second = racer(other, run[other], out)
    if pause_outlasts_the_wait:
        second.join(30)
        assert not isinstance(out[other], Exception), out[other]
        pause.release()
        first.join(30)
        winner, loser = other, paused
    else:
        threading.Timer(0.1, pause.release).start()
        first.join(30)
        second.join(30)
        winner, loser = paused, other
    assert not isinstance(out[winner], Exception), out[winner]
    assert isinstance(out[loser], UniqueViolation), out[loser]
    x = store.get_by("by_name", name="x")
    assert x is not None and (x["id"] == renamed["id"]) == (winner == "rename")
    assert store.get(renamed["id"])["name"] == ("x" if winner == "rename" else "before")
    settled(store)


@pytest.mark.parametrize("renames", [False, True])
def test_a_fence_that_meets_an_owner_committed_meanwhile_is_a_violation(
    make_store: Callable[..., DataStore], renames: bool
) -> None:
    """The claimer decides to fence an owner in flight (a new entity, or one renamed),
    stops before the fence (``unique.before_fence``); the owner commits; the fence,
    guarded by what the claimer read (no row, or the version before), does nothing, and
    the claimer sees a live owner."""
    store = make_store([BY_NAME], claim_wait=0.0)
    entity = {"name": "before"}
    if renames:
        store.put(entity)
    owner_pause, claimer_pause = Pause("owner"), Pause("claimer")
    failpoints.set("put.after_index_rows", owner_pause)
    failpoints.set("unique.before_fence", claimer_pause)
    out: dict[str, Any] = {}
    owner = racer("owner", lambda: store.put({**entity, "name": "x"}), out)
    assert owner_pause.reached.wait(30)
    claimer = racer("claimer", lambda: store.put({"name": "x"}), out)
    assert claimer_pause.reached.wait(30)
    owner_pause.release()
    owner.join(30)
    claimer_pause.release()
    claimer.join(30)
    assert isinstance(out["owner"], int)
    assert isinstance(out["claimer"], UniqueViolation)
    settled(store)


def test_a_takeover_that_meets_a_claim_raised_meanwhile_is_a_violation(
    make_store: Callable[..., DataStore],
) -> None:
    """The claimer has fenced a renaming owner and stops before its takeover
    (``unique.before_takeover``); the owner's step 2 is refused, it claims again with
    a larger version and commits; the takeover's version guard fails."""
    store = make_store([BY_NAME], claim_wait=0.0)
    renamed = {"name": "before"}
    store.put(renamed)
    owner_pause, claimer_pause = Pause("owner"), Pause("claimer")
    failpoints.set("put.after_index_rows", owner_pause)
    failpoints.set("unique.before_takeover", claimer_pause)
    out: dict[str, Any] = {}
    owner = racer("owner", lambda: store.put({"id": renamed["id"], "name": "x"}), out)
    assert owner_pause.reached.wait(30)
    claimer = racer("claimer", lambda: store.put({"name": "x"}), out)
    assert claimer_pause.reached.wait(30)
    owner_pause.release()
    owner.join(30)
    claimer_pause.release()
    claimer.join(30)
    assert isinstance(out["owner"], int), out["owner"]
    assert isinstance(out["claimer"], UniqueViolation), out["claimer"]
    assert store.get_by("by_name", name="x")["id"] == renamed["id"]
    settled(store)


def test_a_claimer_that_dies_after_step_1_is_fenced(make_store: Callable[..., DataStore]) -> None:
    """A writer that raises between its steps (as if killed) leaves a claim ahead of
    its entity; the next claimer waits ``claim_wait``, fences it and wins."""
    store = make_store([BY_NAME], claim_wait=0.05)
    dead = {"name": "x"}
    failpoints.set("put.after_index_rows", "raise")
    with pytest.raises(failpoints.FailpointError):
        store.put(dead)
    failpoints.clear()
    winner = {"name": "x"}
    store.put(winner)
    assert store.get_by("by_name", name="x")["id"] == winner["id"]
    with pytest.raises(UniqueViolation):
        store.put({"id": dead["id"], "name": "x"})
    settled(store)


def test_backfill_over_duplicates_reports_them_and_stays_building(
    make_store: Callable[..., DataStore],
) -> None:
    """Declaring a unique index over data with duplicates (forced): the backfill lists
    each duplicate value with the ids that share it and leaves the index building;
    once they are resolved, the next backfill finishes it."""
    from schemaless.cleaner import Cleaner

    store = make_store()
    names = [f"u{i}" for i in range(60)] + ["dup1", "dup1", "dup2", "dup2", "dup3", "dup3", "dup3"]
    entities = [{"name": name} for name in names]
    store.put_many(entities)
    assert store.declare_index(BY_NAME, force=True) == "building"
    assert Cleaner(store, batch=7).backfill("by_name") == "building"
    found = store.cluster.catalog.duplicates("by_name")
    assert sum(count for count, _ in found.values()) == 4  # one per extra entity
    shared: dict[str, set[str]] = {}
    for _, shown in found.values():
        for item in shown:
            shared.setdefault(item["values"]["name"], set()).update(item["ids"])
    expected = {
        name: {e["id"].hex() for e in entities if e["name"] == name}
        for name in ("dup1", "dup2", "dup3")
    }
    assert shared == expected
    assert store.cluster.refresh().indexes["by_name"].state == "building"
    # resolve: delete one of dup1, rename one of dup2, delete two of dup3
    by_name: dict[str, list[Any]] = {}
    for e in entities:
        by_name.setdefault(e["name"], []).append(e)
    store.delete(by_name["dup1"][0]["id"])
    store.put({"id": by_name["dup2"][1]["id"], "name": "dup2b"})
    store.delete_many([by_name["dup3"][0]["id"], by_name["dup3"][2]["id"]])
    assert Cleaner(store, batch=7).backfill("by_name") == "ready"
    assert store.cluster.catalog.duplicates("by_name") == {}
    store.cluster.refresh()
    for name in ("dup1", "dup2", "dup2b", "dup3", "u5"):
        assert store.get_by("by_name", name=name) is not None
    settled(store)


def test_cli_creates_a_unique_index_and_status_lists_its_duplicates(
    make_store: Callable[..., DataStore], local_cluster: Any
) -> None:
    from test_cleaner_cli import cluster_env as cleaner_env
    from test_cleaner_cli import invoke
    from test_cli import Cli, cluster_env

    store = make_store()
    twins = [{"name": "twin"}, {"name": "twin"}, {"name": "solo"}]
    store.put_many(twins)
    run = Cli(cluster_env(local_cluster, store.cluster.topology.prefix))
    out = run.ok(
        "index", "create", "by_name", "--property", "name:str(64)", "--unique", "--force"
    ).output
    assert "unique" in out and "is building" in out
    cleaner = invoke(cleaner_env(local_cluster, store), "--index", "by_name")
    assert cleaner.exit_code == 1 and "is building, not ready" in cleaner.output, cleaner.output
    status = run.ok("index", "status", "by_name").output
    assert "unique      yes" in status and "duplicates: 1 entities" in status
    line = next(x for x in status.splitlines() if "name='twin'" in x)
    assert twins[0]["id"].hex() in line and twins[1]["id"].hex() in line
    report = json.loads(run.ok("index", "status", "by_name", "--json").output)
    assert report["definition"]["unique"] is True
    assert report["duplicates"] == {
        "count": 1,
        "values": [{"values": {"name": "twin"}, "ids": sorted(t["id"].hex() for t in twins[:2])}],
    }
    store.delete(twins[0]["id"])
    assert invoke(cleaner_env(local_cluster, store), "--index", "by_name").exit_code == 0
    assert "duplicates" not in run.ok("index", "status", "by_name").output


def test_unique_definitions_round_trip_and_old_catalogs_read_the_same() -> None:
    from schemaless.errors import IndexDefinitionError

    d = BY_NAME.to_dict()
    assert d["unique"] is True and Index.from_dict(d) == BY_NAME
    plain = Index("by_name", {"name": "str(64)"})
    assert "unique" not in plain.to_dict()  # a catalog from before reads the same
    assert Index.from_dict(plain.to_dict()) == plain != BY_NAME
    assert "unique=True" in repr(BY_NAME)
    with pytest.raises(IndexDefinitionError, match="True or False"):
        Index("x", ["a"], unique=1)  # type: ignore[arg-type]
    assert "PRIMARY KEY (`p_name`)" in BY_NAME.create_table_sql("db")
    assert "PRIMARY KEY (`p_name`, `entity_id`)" in plain.create_table_sql("db")


@pytest.mark.parametrize("value", ["ada", "", "é✓", b"\x00\xff", 0, -5, 2**62, 1.5, -0.25, True])
def test_readable_gives_back_what_an_auto_column_encoded(value: Any) -> None:
    index = Index("any", ["v", "flag:bool"], unique=True)
    (row,) = index.rows({"v": value, "flag": False})
    assert index.readable(row) == {"v": value, "flag": False}


def test_a_unique_multi_valued_index_claims_each_element(
    make_store: Callable[..., DataStore],
) -> None:
    tags = Index("by_alias", {"aliases": "str(16)"}, multi="aliases", unique=True)
    store = make_store([tags])
    ada = {"aliases": ["ada", "countess"]}
    store.put(ada)
    with pytest.raises(UniqueViolation, match="aliases='countess'"):
        store.put({"aliases": ["lovelace", "countess"]})
    store.put({"id": ada["id"], "aliases": ["ada"]})  # frees "countess"
    other = {"aliases": ["countess"]}
    store.put(other)
    assert tags.get(store, aliases="countess")["id"] == other["id"]
    store.flush()
    assert_clean(store)


def test_unique_rows_follow_shards_that_move_while_names_change_hands(
    make_store: Callable[..., DataStore],
) -> None:
    """A move copies a unique table by its primary key (the values alone) while a
    writer renames entities, freeing and taking over names."""
    import random

    from schemaless.move import ShardMover

    store = make_store([BY_NAME])
    people = [{"name": f"n{i}"} for i in range(60)]
    store.put_many(people)
    stop = threading.Event()
    errors: list[BaseException] = []

    def rename() -> None:
        rnd = random.Random(3)
        try:
            while not stop.is_set():
                key = rnd.choice(people)["id"]
                name = f"n{rnd.randrange(90)}"
                with contextlib.suppress(UniqueViolation):
                    store.update(key, lambda e, name=name: {**(e or {}), "name": name})
        except BaseException as exc:  # reported below
            errors.append(exc)

    writer = threading.Thread(target=rename)
    writer.start()
    try:
        mover = ShardMover(store, chunk=7)
        topo = store.cluster.current()
        for shard in (0, 1, 2):
            there = next(sid for sid in topo.servers if sid != topo.shard_servers[shard])
            mover.move(shard, there)
    finally:
        stop.set()
        writer.join()
    assert not errors, errors
    settled(store)


@pytest.mark.parametrize("released_first", ["renamer", "creator"])
def test_both_racers_stopped_between_their_steps_leave_one_winner(
    make_store: Callable[..., DataStore], released_first: str
) -> None:
    """The renamer claims and stops between its steps; the creator waits, fences it,
    takes the row over and stops between its own steps.  Whichever goes on first wins:
    the creator commits (the renamer's step 2 is refused, it claims again and meets a
    live owner), or the renamer's step 2 is refused, it claims again, waits for the
    creator, fences it and commits (the creator is refused and meets a live owner)."""
    store = make_store([BY_NAME], claim_wait=0.1)
    renamed = {"name": "before"}
    store.put(renamed)
    pauses = {"renamer": Pause("renamer"), "creator": Pause("creator")}

    def both() -> None:
        pauses["renamer"]()
        pauses["creator"]()

    failpoints.set("put.after_index_rows", both)
    out: dict[str, Any] = {}
    run = {
        "renamer": lambda: store.update(renamed["id"], lambda e: {**(e or {}), "name": "x"}),
        "creator": lambda: store.put({"name": "x"}),
    }
    threads = {"renamer": racer("renamer", run["renamer"], out)}
    assert pauses["renamer"].reached.wait(30)
    threads["creator"] = racer("creator", run["creator"], out)
    assert pauses["creator"].reached.wait(30)  # after fencing the renamer
    second = "creator" if released_first == "renamer" else "renamer"
    pauses[released_first].release()
    threads[released_first].join(30)
    pauses[second].release()
    threads[second].join(30)
    assert not isinstance(out[released_first], Exception), out[released_first]
    assert isinstance(out[second], UniqueViolation), out[second]
    x = store.get_by("by_name", name="x")
    assert x is not None and (x["id"] == renamed["id"]) == (released_first == "renamer")
    settled(store)
