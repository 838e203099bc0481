"""The error hierarchy: one root, and honest about what may have been committed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import MySQLdb
import pytest
from conftest import same_store

from schemaless import (
    DataStoreClosed,
    Index,
    OutcomeUnknown,
    SchemalessError,
    ShardTimeout,
    ShardUnavailable,
    TransientError,
    new_id,
)
from schemaless import dump as dumping
from schemaless.errors import PermissionDenied, ServerError
from schemaless.local import LocalCluster, LocalClusterError
from schemaless.names import quote
from schemaless.owned import admin
from schemaless.translate import translate


def test_one_root_and_no_false_promise() -> None:
    assert issubclass(LocalClusterError, SchemalessError)
    for cls in (ShardUnavailable, ShardTimeout, OutcomeUnknown):
        assert issubclass(cls, TransientError) and cls.retryable
    # ShardUnavailable promises that nothing was committed; OutcomeUnknown cannot.
    assert not issubclass(OutcomeUnknown, ShardUnavailable)
    assert not SchemalessError.retryable


def test_catalog_lock_translates_driver_errors(make_store: Any) -> None:
    """A lock's connection killed while it waits in GET_LOCK: a typed error, not the
    driver's."""
    store = make_store()
    catalog = store.cluster.catalog
    prefix = store.cluster.topology.prefix
    errors: list[BaseException] = []

    def wait_for_lock() -> None:
        try:
            with catalog.lock("t", "busy", wait=20):
                pass
        except BaseException as exc:
            errors.append(exc)

    with catalog.lock("t", "busy", wait=1):  # held here: the thread's GET_LOCK waits
        waiter = threading.Thread(target=wait_for_lock)
        waiter.start()
        sql = "SELECT id FROM information_schema.processlist WHERE info LIKE %s"
        pattern = f"SELECT GET_LOCK('schemaless:{prefix}:t'%"
        until = time.monotonic() + 15
        while not (rows := catalog.server.run(sql, (pattern,))[0]):
            assert time.monotonic() < until, "the waiter never reached GET_LOCK"
            time.sleep(0.02)
        catalog.server.run(f"KILL CONNECTION {int(rows[0][0])}")
        waiter.join(15)
    assert not waiter.is_alive()
    (error,) = errors
    assert isinstance(error, TransientError) and not isinstance(error, MySQLdb.Error), error
    assert isinstance(error.__cause__, MySQLdb.Error)


def test_every_verb_after_close_is_a_programming_error(
    make_store: Any, local_cluster: LocalCluster
) -> None:
    """Not a ShardUnavailable: a retry loop would spin on a closed datastore forever."""
    live = make_store([Index("by_user", ["user_id"])])
    store = same_store(local_cluster, live)
    key = new_id()
    store.put({"id": key, "user_id": key})
    store.close()
    calls: list[Callable[[], Any]] = [
        lambda: store.get(key),
        lambda: store.get_many([key, new_id()]),
        lambda: store.put({"id": key, "user_id": key}),
        lambda: store.put_many([{"id": new_id()}]),
        lambda: store.update(key, lambda e: e),
        lambda: store.delete(key),
        lambda: store.delete_many([key]),
        lambda: store.query("by_user", user_id=key),
        lambda: list(store.iter("by_user", user_id=key)),
    ]
    for call in calls:
        with pytest.raises(DataStoreClosed, match="closed") as info:
            call()
        assert not info.value.retryable and not isinstance(info.value, TransientError)


def test_a_table_of_an_earlier_owned_shape_is_named_not_a_raw_error(
    make_store: Any, tmp_path: Any
) -> None:
    """An owned datastore made by an earlier unreleased build lacks the key the scans
    read by (``by_shard_added``): a dump says what to do, not just error 1176."""
    store = make_store()
    store.put({"n": 1})
    topo = store.cluster.topology
    for server in store.cluster.servers():
        server.run(
            admin([f"ALTER TABLE {quote(topo.owned_db, 'entities')} DROP KEY by_shard_added"])
        )
    with pytest.raises(ServerError, match="earlier unreleased build: dump it with that build"):
        dumping.dump(store, tmp_path / "d")


@pytest.mark.parametrize("code", [1045, 1698])
def test_a_refused_login_is_permission_denied(code: int) -> None:
    """1698 (a user without a password, unix_socket authentication) was a ServerError."""
    exc = MySQLdb.OperationalError(code, "Access denied for user 'sch'@'localhost'")
    got = translate("127.0.0.1:3306", exc, sent=False, commits=False)
    assert isinstance(got, PermissionDenied) and "Access denied" in str(got)
