"""``connection.gather``: pipelined batches on several real servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from schemaless.connection import Batch, ConnectOptions, Server, gather, gather_partial
from schemaless.deadline import within
from schemaless.dsn import Credentials, parse_address
from schemaless.errors import (
    OutcomeUnknown,
    ServerError,
    ShardTimeout,
    ShardUnavailable,
    TableMissing,
)
from schemaless.local import LocalCluster


@pytest.fixture
def servers(local_cluster: LocalCluster) -> Any:
    options = ConnectOptions(Credentials(option_file=str(local_cluster.option_file)))
    traced: list[tuple[str, str, float, float]] = []

    def tracer(name: str, sql: str, seconds: float) -> None:
        end = time.perf_counter()
        traced.append((name, sql, end - seconds, end))

    made = [Server(parse_address(a)[0], options, tracer) for a in local_cluster.addresses]
    yield made, traced
    for s in made:
        s.close()


def test_every_batch_is_sent_before_any_reply_is_read(servers: Any) -> None:
    made, traced = servers
    out = gather({i: Batch(s, "SELECT @@port, %s", [i]) for i, s in enumerate(made)})
    assert [out[i][0][0][1] for i in range(len(made))] == list(range(len(made)))
    assert len({out[i][0][0][0] for i in out}) == len(made)  # really different servers
    (a_start, a_end), (b_start, b_end) = [(t[2], t[3]) for t in traced]
    assert a_start < b_end and b_start < a_end  # both round trips were in flight together


def test_one_failing_batch_does_not_lose_the_others(servers: Any) -> None:
    made, _ = servers
    batches = {
        "bad": Batch(made[0], "SELECT * FROM no_such_db.no_such_table"),
        "good": Batch(made[1], "SELECT 42"),
        "syntax": Batch(made[1], "SELEKT 1"),
    }
    results, errors = gather_partial(batches)
    assert results == {"good": [((42,),)]}
    assert set(errors) == {"bad", "syntax"}
    assert isinstance(errors["syntax"], ServerError)
    assert isinstance(errors["bad"], TableMissing)
    with pytest.raises((TableMissing, ServerError)):  # the first error, after every batch
        gather(batches)
    for s in made:  # every connection went back (or was discarded): none is held
        assert s._in_use == 0


def test_a_batch_reports_affected_rows(servers: Any) -> None:
    made, _ = servers
    counts: list[int] = []
    db = "t_gather_counts"
    made[0].run(f"CREATE DATABASE IF NOT EXISTS {db}; CREATE TABLE IF NOT EXISTS {db}.t (a INT)")
    try:
        sql = f"INSERT INTO {db}.t VALUES (1), (2); DELETE FROM {db}.t"
        gather({0: Batch(made[0], sql, counts=counts)})
        assert counts == [2, 2]
    finally:
        made[0].run(f"DROP DATABASE {db}")


def test_a_cancelled_reply_discards_its_connection(servers: Any) -> None:
    made, _ = servers
    reply = Batch(made[0], "SELECT 1").send()
    assert made[0]._in_use == 1
    reply.cancel()
    assert made[0]._in_use == 0
    assert made[0].run("SELECT 2") == [((2,),)]  # the pool still works


def test_a_lock_timeout_is_retried_after_the_other_replies(servers: Any) -> None:
    made, traced = servers
    db = "t_gather_retry"
    made[0].run(
        f"CREATE DATABASE IF NOT EXISTS {db}; DROP TABLE IF EXISTS {db}.t;"
        f"CREATE TABLE {db}.t (a INT PRIMARY KEY) ENGINE=InnoDB; INSERT INTO {db}.t VALUES (1)"
    )
    holder_ready = threading.Event()

    def hold_the_row() -> None:  # holds the row's lock for 1.5 s
        with made[0].connection() as conn:
            conn.query(f"START TRANSACTION; SELECT a FROM {db}.t WHERE a = 1 FOR UPDATE")
            while True:
                result = conn.store_result()
                del result
                if conn.next_result() != 0:
                    break
            holder_ready.set()
            time.sleep(1.5)
            conn.query("COMMIT")

    thread = threading.Thread(target=hold_the_row)
    thread.start()
    retried: list[tuple[str, str]] = []
    made[0].on_retry = lambda name, error: retried.append((name, type(error).__name__))
    try:
        assert holder_ready.wait(5)
        sql = (
            f"SET SESSION innodb_lock_wait_timeout = 1; SELECT a FROM {db}.t WHERE a = 1 FOR UPDATE"
        )
        out = gather({"locked": Batch(made[0], sql), "other": Batch(made[1], "SELECT 7")})
    finally:
        made[0].on_retry = None
        thread.join()
        made[0].run(f"DROP DATABASE {db}")
    assert out == {"locked": [((1,),)], "other": [((7,),)]}
    assert retried == [(made[0].name, "ShardUnavailable")]  # the hook saw the one retry
    assert len([t for t in traced if "FOR UPDATE" in t[1] and "SESSION" in t[1]]) == 2
    assert all(s._in_use == 0 for s in made)


class _Interrupting:
    """A parameter whose SQL literal cannot be made: Ctrl-C while a batch is built."""

    def __str__(self) -> str:
        raise KeyboardInterrupt

    __repr__ = __str__


def test_an_interrupt_is_raised_at_once_and_sends_nothing_more(servers: Any) -> None:
    made, _ = servers
    first, second = sorted(made, key=lambda s: s.name)  # gather's sending order
    assert second.run("SELECT 1") == [((1,),)]  # one idle connection there now
    with pytest.raises(KeyboardInterrupt):
        gather({"a": Batch(first, "SELECT %s", [_Interrupting()]), "b": Batch(second, "SELECT 2")})
    assert len(second._idle) == 1  # the second batch never took (and lost) that connection
    assert first._in_use == second._in_use == 0


def _one_connection_pool(local_cluster: LocalCluster, wait: float) -> Server:
    options = ConnectOptions(
        Credentials(option_file=str(local_cluster.option_file)), pool_size=1, pool_wait=wait
    )
    return Server(parse_address(local_cluster.addresses[0])[0], options)


def test_a_full_pool_makes_callers_wait_for_a_returned_connection(
    local_cluster: LocalCluster,
) -> None:
    server = _one_connection_pool(local_cluster, wait=10.0)
    taken, answers = threading.Event(), []

    def hold() -> None:
        with server.connection() as db:
            taken.set()
            time.sleep(0.3)
            db.query("SELECT 1")
            db.store_result()

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait()
    started = time.monotonic()
    waiters = [
        threading.Thread(target=lambda: answers.append(server.run("SELECT 7"))) for _ in range(3)
    ]
    for t in waiters:
        t.start()
    for t in [holder, *waiters]:
        t.join()
    assert answers == [[((7,),)]] * 3  # each waiter got the connection in turn
    assert time.monotonic() - started >= 0.25  # and none before the holder gave it back
    assert server._in_use == 0 and server._waiting == 0
    server.close()


def test_a_pool_that_stays_full_fails_after_pool_wait(local_cluster: LocalCluster) -> None:
    server = _one_connection_pool(local_cluster, wait=0.2)
    with server.connection():
        started = time.monotonic()
        with pytest.raises(ShardUnavailable, match="connections busy"):
            server.run("SELECT 1")
        assert 0.15 <= time.monotonic() - started < 5
    assert server.run("SELECT 2") == [((2,),)]  # released: usable again
    assert server._waiting == 0
    server.close()


def test_a_connection_the_server_closed_while_idle_is_never_sent_on(
    local_cluster: LocalCluster,
) -> None:
    server = _one_connection_pool(local_cluster, wait=1.0)
    killer = _one_connection_pool(local_cluster, wait=1.0)
    first = server.run("SELECT CONNECTION_ID()")[0][0][0]
    killer.run("KILL CONNECTION %s", [first])
    time.sleep(0.05)  # idle for longer than a just-used connection
    # A batch that commits is never sent again, so a dead connection would fail it.
    rows = server.run("SELECT CONNECTION_ID()", commits=True, idempotent=False)
    assert rows[0][0][0] != first
    server.close()
    killer.close()


def test_a_statement_past_the_servers_max_statement_time_is_a_timeout(servers: Any) -> None:
    """The server's own time limit (error 1969) is a ``ShardTimeout``, retryable, not a
    permanent ``ServerError``; the session that had the limit is not reused."""
    server = servers[0][0]
    with pytest.raises(ShardTimeout, match="max_statement_time"):
        server.run("SET SESSION max_statement_time = 0.1; SELECT SLEEP(2)")
    assert server.run("SELECT @@SESSION.max_statement_time")[0][0][0] == 0


def test_the_call_deadline_cuts_a_reply_and_a_probe_clears_the_mark(servers: Any) -> None:
    """A statement still running at the call's deadline: the watchdog cuts the reply
    (ShardTimeout, or OutcomeUnknown for a batch that commits), the server is marked
    down, and the probe finds it answering again."""
    server = servers[0][0]
    started = time.monotonic()
    with within(0.5), pytest.raises(ShardTimeout, match="deadline"):
        server.run("SELECT SLEEP(5)")
    assert 0.45 <= time.monotonic() - started < 1.5
    assert server.health.state.downs == 1 and "deadline" in server.health.state.reason
    _wait_until(lambda: server.health.state.state == "healthy", 2.0)
    with within(0.5), pytest.raises(OutcomeUnknown, match="deadline"):
        server.run("SELECT SLEEP(5)", commits=True, idempotent=False)
    assert server.health.state.downs == 2
    _wait_until(lambda: server.health.state.state == "healthy", 2.0)
    with within(5):
        assert server.run("SELECT 1") == [((1,),)]


def test_a_full_pool_waits_no_longer_than_the_call_deadline(local_cluster: LocalCluster) -> None:
    server = _one_connection_pool(local_cluster, wait=10.0)
    with server.connection():
        started = time.monotonic()
        with within(0.3), pytest.raises(ShardTimeout, match="deadline passed waiting"):
            server.run("SELECT 1")
        assert 0.25 <= time.monotonic() - started < 2
    assert server.health.state.state == "healthy"  # a busy pool says nothing of the server
    server.close()


def _wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_stale_connection_that_answers_the_ping_is_reused(local_cluster: LocalCluster) -> None:
    server = _one_connection_pool(local_cluster, wait=1.0)
    first = server.run("SELECT CONNECTION_ID()")[0][0][0]
    (conn,) = server._idle
    conn.last_used -= server.options.stale_after + 1
    assert server.run("SELECT CONNECTION_ID()")[0][0][0] == first  # pinged, then reused
    assert server.health.state.state == "healthy"
    server.close()
