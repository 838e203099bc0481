"""Stable placement: which logical shard a key lives on.

``shard_of`` hashes canonical bytes with BLAKE2b, never Python's ``hash()`` (which
is salted per process), so every client and every release agrees forever.
"""

from __future__ import annotations

from collections.abc import Callable
from hashlib import blake2b
from typing import Any

__all__ = ["placer", "shard_of"]


def shard_of(data: bytes, n_shards: int) -> int:
    """The logical shard (0 .. n_shards-1) that owns the canonical bytes ``data``: the
    first 8 bytes of its BLAKE2b digest, big-endian, modulo ``n_shards``."""
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "big") % n_shards


def placer(n_shards: int, encode: Callable[[Any], bytes]) -> Callable[[Any], int]:
    """``shard_of(encode(value), n_shards)`` as one function, without the calls in
    between: the Cleaner places every row of a backfill with it."""
    from_bytes = int.from_bytes

    def place(value: Any) -> int:
        return from_bytes(blake2b(encode(value), digest_size=8).digest(), "big") % n_shards

    return place
