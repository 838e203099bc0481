"""The pure parts of a sick server's handling: ``Health`` and the call deadline."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from schemaless.deadline import Watchdog, current, within
from schemaless.errors import ShardUnavailable
from schemaless.health import Health


def test_a_server_marked_down_fails_calls_at_once_until_it_is_up() -> None:
    health = Health("db1:3306", first_probe=0.05, max_probe=0.4)
    health.check()  # healthy: nothing raised
    assert health.down("server did not answer in time") is True
    assert health.down("again") is False  # already down: no second probe
    with pytest.raises(ShardUnavailable, match=r"db1:3306: marked down since \d\d:\d\d:\d\d"):
        health.check()
    with pytest.raises(ShardUnavailable) as info:
        health.check()
    assert info.value.retryable and "server did not answer in time" in str(info.value)
    assert [health.next_probe() for _ in range(5)] == [0.05, 0.1, 0.2, 0.4, 0.4]
    health.up()
    health.check()
    state = health.state
    assert (state.state, state.since, state.downs) == ("healthy", None, 1)
    health.down("once more")
    assert health.next_probe() == 0.05  # a new mark starts the backoff again


def test_a_suspect_server_is_still_called() -> None:
    health = Health("db1:3306")
    assert health.suspect("lost connection") is True
    assert health.suspect("again") is False
    health.check()  # suspect: calls go on
    assert health.state.state == "suspect" and health.state.reason == "lost connection"
    health.down("timed out")
    assert health.suspect("lost") is False and health.state.state == "down"


def test_a_nested_deadline_never_extends_the_enclosing_one() -> None:
    assert current() is None
    with within(1.0):
        outer = current()
        assert outer is not None and 0.9 < outer - time.monotonic() <= 1.0
        with within(60.0):
            assert current() == outer
        with within(0.1):
            inner = current()
            assert inner is not None and inner < outer
        with within(None):
            assert current() == outer
        assert current() == outer
    assert current() is None
    with pytest.raises(ValueError, match="timeout must be > 0"), within(0):
        pass


def test_the_watchdog_shuts_a_blocked_read_down_at_its_deadline() -> None:
    watchdog = Watchdog()
    a, b = socket.socketpair()
    try:
        armed = watchdog.arm(a.fileno(), time.monotonic() + 0.2)
        started = time.monotonic()
        assert a.recv(1) == b""  # a blocked read returns at the deadline
        assert 0.15 <= time.monotonic() - started < 2
        assert watchdog.disarm(armed) is True
        # Disarmed in time: the socket is left alone.
        c, d = socket.socketpair()
        try:
            armed = watchdog.arm(c.fileno(), time.monotonic() + 0.2)
            d.sendall(b"x")
            assert c.recv(1) == b"x"
            assert watchdog.disarm(armed) is False
            time.sleep(0.3)
            d.sendall(b"y")
            assert c.recv(1) == b"y"
        finally:
            c.close()
            d.close()
    finally:
        a.close()
        b.close()


def test_the_watchdog_serves_deadlines_in_order_from_many_threads() -> None:
    watchdog = Watchdog()
    pairs = [socket.socketpair() for _ in range(4)]
    ended: dict[int, float] = {}
    started = time.monotonic()

    def read(i: int) -> None:
        pairs[i][0].recv(1)
        ended[i] = time.monotonic() - started

    try:
        armed = [watchdog.arm(p[0].fileno(), started + 0.1 * (4 - i)) for i, p in enumerate(pairs)]
        threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert all(watchdog.disarm(a) for a in armed)
        assert sorted(ended, key=ended.__getitem__) == [3, 2, 1, 0]
    finally:
        for x, y in pairs:
            x.close()
            y.close()


def test_the_watchdog_forgets_replies_that_came_in_time() -> None:
    """Every call arms the watchdog and most end long before their deadline: the heap
    is compacted rather than holding every call of the last ``timeout`` seconds."""
    watchdog = Watchdog()
    a, b = socket.socketpair()
    try:
        far = time.monotonic() + 60
        for _ in range(5000):
            assert watchdog.disarm(watchdog.arm(a.fileno(), far)) is False
        assert len(watchdog._heap) <= 2 * 1024
        late = watchdog.arm(a.fileno(), time.monotonic() + 0.1)
        assert a.recv(1) == b""  # the one still armed is served
        assert watchdog.disarm(late) is True
    finally:
        a.close()
        b.close()


def test_the_end_of_a_mark_is_logged_at_the_marks_level(caplog: pytest.LogCaptureFixture) -> None:
    """A suspect mark is INFO, so its end is too: it was a WARNING, which the CLI printed
    beside its own ``answers again`` (``changes --follow --partial``, a new user's trial)."""
    health = Health("db1:3306")
    with caplog.at_level(logging.INFO, logger="schemaless.health"):
        health.suspect("connection refused")
        health.up()
        health.down("timed out")
        health.up()
    assert [(r.levelno, r.getMessage().split(",")[0]) for r in caplog.records] == [
        (logging.INFO, "db1:3306 suspect: connection refused"),
        (logging.INFO, "db1:3306 no longer suspect"),
        (logging.WARNING, "db1:3306 marked down: timed out"),
        (logging.WARNING, "db1:3306 no longer down"),
    ]
