"""The error hierarchy: one root, and honest about what may have been committed."""

from __future__ import annotations

import threading
import time
from typing import Any

import MySQLdb

from schemaless import (
    OutcomeUnknown,
    SchemalessError,
    ShardTimeout,
    ShardUnavailable,
    TransientError,
)
from schemaless.local import LocalClusterError


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
