"""Reads of the per-shard tables: entity rows by id (shared by the read path, the
write path and the Cleaner), and the ``UNION ALL`` of per-shard parts that every
multi-shard statement is (the SQL of writes is in ``schemaless.writes``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from .names import quote
from .owned import guarded
from .schema import shard_db

__all__ = ["by_id_sql", "union_all"]


def by_id_sql(
    prefix: str, ids: Mapping[int, Sequence[bytes]], columns: str, owned: str | None = None
) -> tuple[str, list[Any]]:
    """``SELECT <columns>`` of entities by id (``shard -> ids``), tombstones included,
    in one ``UNION ALL`` statement.  (Filtering tombstones, or naming each row's
    shard, in the SQL costs the server more than doing it in the client.)  ``owned``:
    the owned layout's data database: one ``SELECT``, then the ownership check."""
    if owned is not None:
        every = [key for shard in sorted(ids) for key in ids[shard]]
        head = f"SELECT {columns} FROM {quote(owned, 'entities')} WHERE `id` IN ("
        return guarded([head + _marks(len(every))], owned, ids), every
    parts = []
    params: list[Any] = []
    for shard, keys in sorted(ids.items()):
        parts.append(_by_id_head(prefix, shard, columns) + _marks(len(keys)))
        params += keys
    return union_all(parts), params


@functools.lru_cache(maxsize=4096)
def _by_id_head(prefix: str, shard: int, columns: str) -> str:
    return f"SELECT {columns} FROM {quote(shard_db(prefix, shard), 'entities')} WHERE `id` IN ("


@functools.lru_cache(maxsize=1024)
def _marks(n: int) -> str:
    return ", ".join(["%s"] * n) + ")"


def union_all(parts: Sequence[str], tail: str = "") -> str:
    """One statement of several ``SELECT`` parts (put in parentheses those with their own
    ``ORDER BY`` or ``LIMIT``); ``tail`` applies to the whole."""
    return " UNION ALL ".join(parts) + tail
