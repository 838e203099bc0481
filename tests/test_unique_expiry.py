"""An expired owner holds no unique value (docs/architecture.md, "Unique indexes"):
its value is claimable at once, a re-put of the owner racing the claim has exactly one
winner at every step of the protocol, and the Cleaner's expiry spares a row taken
over; a brute-force oracle runs writers over a few values with short expiry times."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import assert_clean, same_store
from test_unique import BY_NAME, Pause, owners, racer, settled

from schemaless import DataStore, UniqueViolation, failpoints
from schemaless.cleaner import Cleaner
from schemaless.cleaner.access import read_entities
from schemaless.expiry import expired
from schemaless.ids import new_id
from schemaless.local import LocalCluster


def _store(make: Callable[..., DataStore], **kwargs: Any) -> DataStore:
    return make([BY_NAME], expire_on="exp", **kwargs)


def _body(store: DataStore, key: bytes) -> bytes | None:
    """The stored body of ``key`` as it is (None: a tombstone or no row)."""
    found = read_entities(store, store.cluster.refresh(), [key])
    return found[key].body if key in found else None


def test_an_expired_owner_does_not_hold_its_value(make_store: Callable[..., DataStore]) -> None:
    store = _store(make_store)
    old = {"name": "token", "exp": time.time() - 1}
    store.put(old)
    assert store.get_by("by_name", name="token") is None
    new = {"name": "token"}
    store.put(new)  # at once: no Cleaner pass
    assert store.get_by("by_name", name="token") == new
    assert _body(store, old["id"]) is not None  # not purged yet, and not the owner
    assert owners(store) == {("token",): new["id"]}
    assert_clean(store)  # the expired entity's row is not expected back
    with pytest.raises(UniqueViolation):  # the old owner wants it back: too late
        store.put({"id": old["id"], "name": "token"}, ttl=3600)
    live = {"name": "live", "exp": time.time() + 3600}
    store.put(live)
    with pytest.raises(UniqueViolation):  # an owner whose time has not come holds it
        store.put({"name": "live"})
    settled(store)
    assert _body(store, old["id"]) is None  # the Cleaner deleted the expired one


@pytest.mark.parametrize("how", ["put", "update"])
def test_a_reput_of_the_owner_before_the_takeover_wins(
    make_store: Callable[..., DataStore], how: str
) -> None:
    """The claimer reads the owner expired and stops before its takeover
    (``unique.before_takeover``); the owner is re-put with a new expiry time and
    commits, raising the row's version; the takeover's guard fails, and the claimer
    reads the owner again: live, a violation."""
    store = _store(make_store)
    owner = {"name": "x", "exp": time.time() - 1}
    store.put(owner)
    pause = Pause("claimer")
    failpoints.set("unique.before_takeover", pause)
    out: dict[str, Any] = {}
    claimer = racer("claimer", lambda: store.put({"name": "x"}), out)
    assert pause.reached.wait(30)
    again = {"id": owner["id"], "name": "x", "exp": time.time() + 3600}
    if how == "put":
        store.put(again)
    else:
        store.update(owner["id"], lambda e: {**again} if e is None else e)
    pause.release()
    claimer.join(30)
    assert isinstance(out["claimer"], UniqueViolation), out["claimer"]
    assert store.get_by("by_name", name="x") == again
    settled(store)


@pytest.mark.parametrize("pause_outlasts_the_wait", [False, True])
def test_an_owner_reput_in_flight_is_waited_for_or_fenced(
    make_store: Callable[..., DataStore], pause_outlasts_the_wait: bool
) -> None:
    """The owner's re-put claims (its row ahead of the stored, expired body) and stops
    before its step 2.  A short pause: the claimer waits and sees the owner live (a
    violation).  A long one: the claimer fences the owner and takes the value; the
    owner's step 2 is refused, it writes again and meets the claimer (a violation), and
    stays expired."""
    store = _store(make_store, claim_wait=0.3)
    owner = {"name": "x", "exp": time.time() - 1}
    store.put(owner)
    pause = Pause("owner")
    failpoints.set("put.after_index_rows", pause)
    out: dict[str, Any] = {}
    again = {"id": owner["id"], "name": "x", "exp": time.time() + 3600}
    first = racer("owner", lambda: store.put(again), out)
    assert pause.reached.wait(30)
    claimer = {"name": "x"}
    second = racer("claimer", lambda: store.put(claimer), out)
    if pause_outlasts_the_wait:
        second.join(30)
        pause.release()
        first.join(30)
        winner, loser = claimer, "owner"
    else:
        threading.Timer(0.1, pause.release).start()
        first.join(30)
        second.join(30)
        winner, loser = again, "claimer"
    assert isinstance(out[loser], UniqueViolation), out[loser]
    assert store.get_by("by_name", name="x") == winner
    assert (store.get(owner["id"]) is None) == pause_outlasts_the_wait
    settled(store)


def test_the_cleaners_expiry_spares_a_row_taken_over(
    make_store: Callable[..., DataStore], local_cluster: LocalCluster
) -> None:
    """The Cleaner reads the owner expired and stops before its delete; a claimer takes
    the value over; the delete (a tombstone, and the old body's rows deleted where they
    still name the owner) leaves the claimer's row."""
    store = _store(make_store)
    owner = {"name": "x", "exp": time.time() - 1}
    store.put(owner)
    writer = same_store(local_cluster, store)
    claimer = {"name": "x"}
    failpoints.set("cleaner.expire.before_delete", lambda: writer.put(claimer))
    figures = Cleaner(store).run_once()
    failpoints.clear()
    assert figures["expired_purged"] == 1
    assert _body(store, owner["id"]) is None
    assert owners(store) == {("x",): claimer["id"]}
    assert store.get_by("by_name", name="x") == claimer
    writer.close()
    settled(store)


def test_oracle_writers_share_a_few_values_with_short_expiry_times(
    make_store: Callable[..., DataStore], local_cluster: LocalCluster
) -> None:
    """Three writers, each with its own ids, put them with one of four names and a
    past, short or long expiry time, first alone, then with a Cleaner running.  After:
    every entity is as its last acknowledged write left it (or deleted once expired),
    each name has at most one unexpired live holder and the unique row names it, and
    values changed hands while their holders had only expired (no Cleaner then)."""
    store = _store(make_store, claim_wait=0.05)
    names = ["a", "b", "c", "d"]
    model: dict[bytes, dict[str, Any]] = {}
    holders: dict[str, set[bytes]] = {n: set() for n in names}  # acknowledged, phase 1
    lock = threading.Lock()
    phase = {"cleaner": False}

    errors: list[Exception] = []

    def writer(seed: int, stop: threading.Event) -> None:
        rng = random.Random(seed)
        client = same_store(local_cluster, store)
        ids = [new_id() for _ in range(6)]
        try:
            while not stop.is_set():
                key = rng.choice(ids)
                roll = rng.random()
                exp = time.time() + (-1 if roll < 0.5 else 0.05 if roll < 0.9 else 3600)
                body = {"id": key, "name": rng.choice(names), "exp": exp}
                try:
                    client.put(body)
                except UniqueViolation:
                    continue
                with lock:
                    model[key] = body
                    if not phase["cleaner"]:
                        holders[body["name"]].add(key)
        except Exception as exc:  # the test fails on it below
            errors.append(exc)
        finally:
            client.close()

    def run(seconds: float, cleaner: bool) -> None:
        stop = threading.Event()
        threads = [threading.Thread(target=writer, args=(i, stop)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + seconds
        passes = 0
        while time.monotonic() < deadline:
            if cleaner:
                Cleaner(store, batch=5).run_once()
                passes += 1
            else:
                time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(30)
        assert not cleaner or passes > 0
        assert errors == []

    run(2.0, cleaner=False)
    assert sum(len(ids) for ids in holders.values()) > len(names)  # values changed hands
    phase["cleaner"] = True
    run(2.0, cleaner=True)
    time.sleep(0.1)  # every short expiry time has passed
    now = time.time()
    held: dict[str, list[bytes]] = {}
    for key, want in model.items():
        stored = store.get(key)
        body = _body(store, key)
        if expired(want, "exp", now):
            assert stored is None, key.hex()
        else:
            assert stored == want, key.hex()
            held.setdefault(want["name"], []).append(key)
        if body is not None:  # a stored body is the last acknowledged one
            assert store.decode(key, store.cluster.shard_of_id(key), 0, body) == want
    assert all(len(ids) == 1 for ids in held.values()), held
    rows = owners(store)
    assert all(rows[(name,)] == ids[0] for name, ids in held.items())
    assert_clean(store)
    for name in names:  # a value whose holders have all expired is free at once
        if name not in held:
            store.put({"name": name})
    settled(store)


def test_a_backfill_counts_no_expired_entity_as_a_duplicate(
    make_store: Callable[..., DataStore],
) -> None:
    """A unique index declared over a live entity and an expired one (not yet deleted)
    that share a value, in both orders on one logical shard: the live one keeps the
    value and the index becomes ready."""
    store = make_store(shards=1, expire_on="exp")
    past = time.time() - 1
    first_live = [{"name": "a"}, {"name": "a", "exp": past}]
    first_expired = [{"name": "b", "exp": past}, {"name": "b"}]
    for entity in [*first_live, *first_expired]:
        store.put(entity)  # one at a time: in this order by added_id
    assert store.declare_index(BY_NAME) == "building"
    assert Cleaner(store, batch=1).backfill("by_name") == "ready"
    assert store.cluster.catalog.duplicates("by_name") == {}
    assert owners(store) == {("a",): first_live[0]["id"], ("b",): first_expired[1]["id"]}
    assert_clean(store)
    settled(store)
