"""Placement is a contract with the data already stored: pinned values."""

from __future__ import annotations

import pytest

from schemaless.hashing import placer, shard_of
from schemaless.index import key_encode


@pytest.mark.parametrize(
    ("key", "shards"),
    [
        (bytes(range(16)), (2, 10, 1002)),  # an entity id
        (b"\xff" * 16, (7, 7, 807)),
        (key_encode(42), (6, 14, 670)),  # index values of each type sharded on
        (key_encode("alice"), (6, 14, 878)),
        (key_encode(b"\x00"), (3, 3, 115)),
    ],
)
def test_a_key_lives_on_the_same_logical_shard_in_every_release(
    key: bytes, shards: tuple[int, int, int]
) -> None:
    assert tuple(shard_of(key, n) for n in (8, 16, 1024)) == shards


def test_every_shard_is_used_and_none_beyond_the_count() -> None:
    seen = {shard_of(i.to_bytes(16, "big"), 16) for i in range(2000)}
    assert seen == set(range(16))


@pytest.mark.parametrize("n", [1, 8, 16, 1024])
def test_placer_is_shard_of_the_encoding(n: int) -> None:
    place = placer(n, key_encode)
    values: list[object] = [42, -(2**63), 2**63 - 1, "alice", "", b"\x00" * 16, 1.5, -0.0]
    values += list(range(-500, 500, 7))
    for value in values:
        assert place(value) == shard_of(key_encode(value), n)
