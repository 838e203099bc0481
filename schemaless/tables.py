"""Reads of the per-shard tables: entity rows by id (shared by the read path, the
write path and the Cleaner), and the ``UNION ALL`` of per-shard parts that every
multi-shard statement is (the SQL of writes is in ``schemaless.writes``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .names import quote
from .owned import CHECK, guarded, owns_sql
from .schema import shard_db

if TYPE_CHECKING:
    from .topology import Topology

__all__ = ["by_id_sql", "union_all"]


def by_id_sql(
    topo: Topology, ids: Mapping[int, Sequence[bytes]], columns: str, *, counted: bool = False
) -> tuple[str, list[Any]]:
    """``SELECT <columns>`` of entities by id (``shard -> ids``, all on one server),
    tombstones included, in one ``UNION ALL`` statement (``Cluster.by_id`` sends it,
    its first column the id).  (Filtering tombstones, or naming each row's shard, in
    the SQL costs the server more than doing it in the client.)  In the owned layout one
    ``SELECT`` joined to the server's ``owned_digest`` row: it returns no row at all
    unless the server owns exactly the shards the map places on it (a row of NULLs
    if none of the ids is stored), one row read for the proof; ``counted``: the
    ``SELECT`` then the check that counts the shards named (when the digest differs,
    as from a move's fence to its flip)."""
    owned = topo.owned_db
    if owned is None:
        parts = []
        params: list[Any] = []
        for shard, keys in sorted(ids.items()):
            parts.append(_by_id_head(topo.prefix, shard, columns) + _marks(len(keys)))
            params += keys
        return union_all(parts), params
    every = [key for shard in sorted(ids) for key in ids[shard]]
    entities = quote(owned, "entities")
    if counted:
        select = f"SELECT {columns} FROM {entities} WHERE `id` IN ({_marks(len(every))}"
        return guarded([select], owned, ids), every
    placed = topo.placed[topo.shard_servers[next(iter(ids))]]
    sql = (
        f"SELECT {CHECK} {columns} FROM {quote(owned, 'owned_digest')} d LEFT JOIN"
        f" {entities} ON `id` IN ({_marks(len(every))} WHERE {owns_sql(placed)}"
    )
    return sql, every


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
