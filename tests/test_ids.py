"""Unit tests for schemaless.ids: UUIDv7 layout, monotonicity, parsing."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from typing import Any

import pytest

from schemaless import ids
from schemaless.errors import InvalidId
from schemaless.ids import id_hex, new_id, parse_id, to_id


def millis(value: bytes) -> int:
    return int.from_bytes(value[:6], "big")


def counter(value: bytes) -> int:
    return int.from_bytes(value[6:8], "big") & 0x0FFF


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A settable clock (ns) for ids, with the generator's state reset around the test."""
    now = [1_800_000_000_000 * 1_000_000]
    monkeypatch.setattr(ids, "time_ns", lambda: now[0])
    monkeypatch.setattr(ids, "_last_ms", 0)
    monkeypatch.setattr(ids, "_counter", 0)
    return now


def test_layout() -> None:
    value = new_id()
    assert type(value) is bytes and len(value) == 16
    as_uuid = uuid.UUID(bytes=value)
    assert as_uuid.version == 7
    assert as_uuid.variant == uuid.RFC_4122
    assert value[6] >> 4 == 7
    assert value[8] >> 6 == 0b10


def test_timestamp_is_now() -> None:
    before = time.time_ns() // 1_000_000
    value = new_id()
    after = time.time_ns() // 1_000_000
    assert before <= millis(value) <= after + 1


def test_strictly_increasing_and_unique() -> None:
    values = [new_id() for _ in range(10_000)]
    assert values == sorted(set(values))  # strictly increasing
    assert all(uuid.UUID(bytes=v).version == 7 for v in values)


def test_random_bits_differ() -> None:
    tails = {int.from_bytes(new_id()[8:], "big") & ((1 << 62) - 1) for _ in range(1000)}
    assert len(tails) == 1000


def test_time_ordered() -> None:
    first = new_id()
    time.sleep(0.005)
    second = new_id()
    assert millis(second) >= millis(first) + 5
    assert first < second


def test_counter_orders_ids_in_one_millisecond(fake_clock: list[int]) -> None:
    values = [new_id() for _ in range(100)]
    assert {millis(v) for v in values} == {fake_clock[0] // 1_000_000}
    assert [counter(v) for v in values] == list(range(100))
    fake_clock[0] += 1_000_000
    later = new_id()
    assert millis(later) == millis(values[0]) + 1 and counter(later) == 0


def test_counter_overflow_borrows_the_next_millisecond(fake_clock: list[int]) -> None:
    values = [new_id() for _ in range(5000)]
    assert values == sorted(set(values))
    start = fake_clock[0] // 1_000_000
    assert millis(values[4095]) == start and counter(values[4095]) == 4095
    assert millis(values[4096]) == start + 1 and counter(values[4096]) == 0
    fake_clock[0] += 1_000_000  # the clock reaches the borrowed millisecond: still increasing
    assert new_id() > values[-1]


def test_clock_going_back_keeps_ids_increasing(fake_clock: list[int]) -> None:
    first = new_id()
    fake_clock[0] -= 10_000 * 1_000_000
    second = new_id()
    assert second > first
    assert millis(second) == millis(first)


def test_threads_get_unique_increasing_ids() -> None:
    per_thread: list[list[bytes]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def work(out: list[bytes]) -> None:
        barrier.wait()
        out.extend(new_id() for _ in range(2000))

    threads = [threading.Thread(target=work, args=(out,)) for out in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [v for out in per_thread for v in out]
    assert len(set(every)) == len(every) == 16_000
    for out in per_thread:
        assert out == sorted(set(out))


# -- to_id / id_hex / parse_id ------------------------------------------------------------


def test_to_id_accepts_bytes_and_uuid() -> None:
    raw = new_id()
    assert to_id(raw) is raw
    value = uuid.uuid4()
    assert to_id(value) == value.bytes

    class Raw(bytes):
        pass

    converted = to_id(Raw(raw))
    assert type(converted) is bytes and converted == raw


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"x" * 15, "got bytes of length 15"),
        (b"x" * 17, "got bytes of length 17"),
        (b"", "got bytes of length 0"),
        ("0" * 32, "got str of length 32: '0000.*; use parse_id"),
        (bytearray(16), "got bytearray of length 16"),
        (memoryview(bytes(16)), "got memoryview of length 16"),
        (12345, "got int: 12345$"),
        (None, "got NoneType: None$"),
        (uuid.UUID("0190f3a4-c2e4-7b3d-8a1f-5e6d7c8b9a01").int, "got int"),
    ],
)
def test_to_id_refuses(value: Any, message: str) -> None:
    with pytest.raises(InvalidId, match=rf"^entity id must be 16 bytes or uuid.UUID, {message}"):
        to_id(value)


def test_to_id_message_is_short_for_huge_values() -> None:
    with pytest.raises(InvalidId) as info:
        to_id(b"x" * 1_000_000)
    assert "length 1000000" in str(info.value)
    assert len(str(info.value)) < 150
    assert issubclass(InvalidId, ValueError)


def test_id_hex() -> None:
    raw = bytes(range(16))
    assert id_hex(raw) == "000102030405060708090a0b0c0d0e0f"
    value = uuid.UUID("F81D4FAE-7DEC-11D0-A765-00A0C91E6BF6")
    assert id_hex(value) == "f81d4fae7dec11d0a76500a0c91e6bf6"
    with pytest.raises(InvalidId):
        id_hex(b"short")


def test_parse_id_accepts_both_forms() -> None:
    raw = new_id()
    assert parse_id(id_hex(raw)) == raw
    assert parse_id(id_hex(raw).upper()) == raw
    assert parse_id(str(uuid.UUID(bytes=raw))) == raw
    assert parse_id(str(uuid.UUID(bytes=raw)).upper()) == raw


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0" * 31,
        "0" * 33,
        "g" * 32,
        " " + "0" * 32,
        "0" * 32 + "\n",
        "{f81d4fae-7dec-11d0-a765-00a0c91e6bf6}",
        "urn:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
        "f81d4fae7dec-11d0-a765-00a0c91e6bf6",
        "f81d4fae-7dec-11d0-a76500a0c91e6bf6-",
        "f81d4fae_7dec_11d0_a765_00a0c91e6bf6",
        "\u0660" * 32,  # Arabic-Indic digits are not hex digits here
        "0x" + "0" * 30,
    ],
)
def test_parse_id_refuses(text: str) -> None:
    with pytest.raises(InvalidId, match="32 hex characters or the 36-character UUID form"):
        parse_id(text)


def test_parse_id_refuses_non_text() -> None:
    for value in (b"0" * 32, None, 5, uuid.uuid4()):
        with pytest.raises(InvalidId):
            parse_id(value)  # type: ignore[arg-type]
    with pytest.raises(InvalidId) as info:
        parse_id("a" * 100_000)
    assert len(str(info.value)) < 150


def test_fork_while_another_thread_holds_the_lock() -> None:
    with ids._lock:  # as if another thread were inside new_id() at fork time
        pid = os.fork()
        if pid == 0:  # the child: must not deadlock
            new_id()
            os._exit(0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("new_id() deadlocked in a forked child")


def test_the_function_an_id_error_names_is_exported() -> None:
    """The error says to call parse_id(): ``from schemaless import parse_id`` works."""
    import schemaless

    text = ids.id_hex(ids.new_id())
    with pytest.raises(InvalidId, match=r"use parse_id\(\)"):
        ids.to_id(text)
    assert "parse_id" in schemaless.__all__
    assert schemaless.parse_id(text) == bytes.fromhex(text)
