"""``DataStore.count``: exact counts from a counted index's counters, or the index
rows that match (``exact=False``: an upper bound); docs/architecture.md, "Counts"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .counts import need_owned, prefix_key
from .errors import InvalidQuery
from .index import Index
from .names import quote
from .owned import guarded, shards_sql
from .query import Query, QueryEngine, _where_sql
from .topology import Topology

__all__ = ["count"]


def count(
    engine: QueryEngine, index: Index | str, conditions: Mapping[str, Any], exact: bool
) -> int:
    """``DataStore.count``: the entities matching equality ``conditions`` on a prefix
    of a counted index, from its counters (``exact``), or the index rows matching any
    query's conditions (not ``exact``: an upper bound)."""
    if not isinstance(exact, bool):
        raise InvalidQuery(f"exact must be True or False, got {exact!r}")
    topo = engine.cluster.current()
    need_owned(topo, "count")
    q = engine.plan(index, conditions, "asc", 1, include_building=False)
    if exact:
        return _exact(engine, topo, q)
    return _rows(engine, topo, q)


def _exact(engine: QueryEngine, topo: Topology, q: Query) -> int:
    idx = q.index
    if not idx.counted:
        raise InvalidQuery(
            f"index {idx.name!r} is not counted: declare one with counted=True "
            "(`schemaless index create ... --counted`), or pass exact=False (`--no-exact`)"
        )
    if q.lower is not None or q.upper is not None:
        raise InvalidQuery(
            f"an exact count takes equality on a prefix of index {idx.name!r} "
            f"({', '.join(idx.properties)}); a range or a prefix match needs exact=False "
            "(`count --no-exact`: an upper bound) or a query"
        )
    if len(q.eqs) > 1 and idx.multi_pos is not None and idx.multi_pos < q.k:
        raise InvalidQuery(
            f"an exact count cannot take __in with the multi-valued property {idx.multi!r} "
            "in the prefix (an entity with two of the values would count twice); "
            "use exact=False or a query"
        )
    created = topo.indexes[idx.name].created
    keys = sorted({prefix_key(idx, created, eq).hex() for eq in q.eqs})
    owned = topo.owned_db
    assert owned is not None
    marks = ", ".join(["UNHEX(%s)"] * len(keys))

    def build(shards: tuple[int, ...]) -> tuple[str, list[Any]]:
        sql = (
            f"SELECT COALESCE(SUM(`n`), 0) FROM {quote(owned, 'counts')}"
            f" WHERE {shards_sql(shards)} AND `key` IN ({marks})"
        )
        return guarded([sql], owned, shards), list(keys)

    results = engine.cluster.scatter(topo, topo.placed, build).results
    return sum(int(sets[0][0][0]) for sets in results.values())


def _rows(engine: QueryEngine, topo: Topology, q: Query) -> int:
    """``COUNT(*)`` of the index rows that match, every value of an ``__in`` list."""
    owned = topo.owned_db
    assert owned is not None
    cols = q.index.columns
    lower = None if q.lower is None else q.lower[1]
    upper = None if q.upper is None else q.upper[1]
    where = _where_sql(cols, q.k, q.bounds is not None, lower, upper, False, False, False)
    rest = QueryEngine._where(q, None)[1]
    table = quote(owned, q.index.table)

    def build(shards: tuple[int, ...]) -> tuple[str, list[Any]]:
        one = f"SELECT COUNT(*) FROM {table} WHERE {shards_sql(shards)} AND {where}"
        return guarded([one] * len(q.eqs), owned, shards), [v for eq in q.eqs for v in (*eq, *rest)]

    results = engine.cluster.scatter(topo, topo.placed, build).results
    return sum(int(rows[0][0]) for sets in results.values() for rows in sets)
