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
    ``SELECT`` of the rows by their clustered key ``(shard, id)`` joined to the
    server's ``owned_digest`` row: no row at all unless the server owns exactly the
    shards the map places on it, one row read for the proof (no row also when none
    of the ids is stored: a row of NULLs to tell the two apart cost a ``UNION``);
    ``counted``: the ``SELECT`` then the check that counts the shards named (read
    when the first returned nothing: a move between its fence and its flip, or no
    id stored)."""
    owned = topo.owned_db
    if owned is None:
        parts = []
        params: list[Any] = []
        for shard, keys in sorted(ids.items()):
            parts.append(_by_id_head(topo.prefix, shard, columns) + _marks(len(keys)))
            params += keys
        return union_all(parts), params
    pairs = [",".join(f'[{int(shard)},"{key.hex()}"]' for key in ids[shard]) for shard in ids]
    listed = ["[" + ",".join(pairs) + "]"]
    keyed = _keyed(quote(owned, "entities"))
    if counted:
        return guarded([f"SELECT {columns} FROM {keyed}"], owned, ids), listed
    placed = topo.placed[topo.shard_servers[next(iter(ids))]]
    digest = f"{quote(owned, 'owned_digest')} d JOIN"
    return f"SELECT {CHECK} {columns} FROM {digest} {keyed} WHERE {owns_sql(placed)}", listed


@functools.lru_cache(maxsize=4096)
def _by_id_head(prefix: str, shard: int, columns: str) -> str:
    return f"SELECT {columns} FROM {quote(shard_db(prefix, shard), 'entities')} WHERE `id` IN ("


@functools.lru_cache(maxsize=1024)
def _marks(n: int) -> str:
    return ", ".join(["%s"] * n) + ")"


@functools.lru_cache(maxsize=1024)
def _keyed(entities: str) -> str:
    """Entity rows by their clustered key: a JSON list of ``[shard, "<id in hex>"]``
    (one parameter) as a table joined to the primary key, one ``eq_ref`` dive each.
    (``(shard, id) IN ((s, x), ...)`` spends milliseconds of the range optimizer on
    100 pairs; ``IN (VALUES ...)`` a semi-join's temporary table, a ``VALUES`` list
    joined as a derived table about 250 µs a statement to materialize it.)"""
    return (
        "JSON_TABLE(%s, '$[*]' COLUMNS (s INT PATH '$[0]', x CHAR(32) PATH '$[1]')) v"
        f" JOIN {entities} e ON e.`shard` = v.s AND e.`id` = UNHEX(v.x)"
    )


def union_all(parts: Sequence[str], tail: str = "") -> str:
    """One statement of several ``SELECT`` parts (put in parentheses those with their own
    ``ORDER BY`` or ``LIMIT``); ``tail`` applies to the whole."""
    return " UNION ALL ".join(parts) + tail
