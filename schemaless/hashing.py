"""Stable placement: which logical shard a key lives on.

``shard_of`` hashes canonical bytes with BLAKE2b, never Python's ``hash()`` (which
is salted per process), so every client and every release agrees forever.
"""

from __future__ import annotations

import hashlib

__all__ = ["shard_of", "stable_hash"]


def stable_hash(data: bytes) -> int:
    """A 64-bit hash of ``data`` that is the same in every process and release."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def shard_of(data: bytes, n_shards: int) -> int:
    """The logical shard (0 .. n_shards-1) that owns the canonical bytes ``data``."""
    return stable_hash(data) % n_shards
