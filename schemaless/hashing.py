"""Stable placement: which logical shard a key lives on.

``shard_of`` hashes canonical bytes with BLAKE2b, never Python's ``hash()`` (which
is salted per process), so every client and every release agrees forever.
"""

from __future__ import annotations

from collections.abc import Callable
from hashlib import blake2b
from typing import Any

__all__ = ["placer", "shard_of"]


#: A fresh 8-byte BLAKE2b state: copying it costs less than a new one's parameters.
_FRESH = blake2b(digest_size=8)


def shard_of(data: bytes, n_shards: int) -> int:
    """The logical shard (0 .. n_shards-1) that owns the canonical bytes ``data``: the
    first 8 bytes of its BLAKE2b digest, big-endian, modulo ``n_shards``."""
    h = _FRESH.copy()
    h.update(data)
    return int.from_bytes(h.digest(), "big") % n_shards


def placer(n_shards: int, encode: Callable[[Any], bytes]) -> Callable[[Any], int]:
    """``shard_of(encode(value), n_shards)`` as one function, without the calls in
    between: the Cleaner places every row of a backfill with it."""
    from_bytes = int.from_bytes
    fresh = _FRESH.copy

    def place(value: Any) -> int:
        h = fresh()
        h.update(encode(value))
        return from_bytes(h.digest(), "big") % n_shards

    return place
