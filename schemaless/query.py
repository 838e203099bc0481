"""The query engine: plan, route, scan index tables, fetch, re-filter, page.

An index row is a hint, never the truth: every candidate entity is fetched and kept
only if its stored body produces that very row, the row matches the query, and it
is the entity's first matching row in query order (so an entity with several
matching rows of a multi-valued index appears once).  Short pages continue from the
cursor until full or the index is exhausted.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from .catalog import IndexState
from .cluster import Cluster
from .errors import IndexNotReady, InvalidCursor, InvalidEntity, InvalidQuery
from .follow import Calls
from .hashing import shard_of
from .index import Index, key_encode
from .names import quote
from .owned import among, guarded
from .reader import Reader
from .scatter import Statement, unreachable_only
from .tables import union_all

if TYPE_CHECKING:
    from .entity import Entity

__all__ = ["Page", "Query", "QueryEngine", "prefix_end", "prefix_value"]

MAX_LIMIT = 1000
MAX_IN = 1000
_OPS = {"gt": (">", False), "gte": (">=", True), "lt": ("<", False), "lte": ("<=", True)}
_MAX_CHAR = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)  # not characters: utf8mb4 has no encoding for them
_CURSOR_VERSION = 1
_MAX_CURSOR = 16384
_PY_TYPES: dict[str, type] = {"int": int, "float": float, "bool": int}
#: A scan's part on one server: logical shards, and the equality prefix they share.
Part = tuple[tuple[int, ...], tuple[Any, ...]]


class Page(list["Entity"]):
    """A list of entities, with ``cursor`` for the next page (None at the end) and
    ``missing_shards``: logical shards that did not answer (only with partial=True)."""

    def __init__(
        self, items: list[Entity], cursor: str | None, missing_shards: tuple[int, ...] = ()
    ) -> None:
        super().__init__(items)
        self.cursor = cursor
        self.missing_shards = missing_shards


@dataclass(frozen=True)
class Query:
    """A planned query: equality prefix, optional range, direction, page size."""

    index: Index
    eqs: tuple[tuple[Any, ...], ...]  # allowed values of the equality prefix (several: __in)
    lower: tuple[Any, bool] | None  # (coerced value, inclusive) on properties[len(eq)]
    upper: tuple[Any, bool] | None
    bounds: tuple[bytes, bytes] | None  # auto columns: keep the range within one type
    descending: bool
    limit: int
    partial: bool = False
    consistency: str = "primary"
    prefix: str | bytes | None = None  # __startswith: the range's values start with it

    @functools.cached_property
    def fingerprint(self) -> bytes:
        """Identifies the query a cursor belongs to."""
        data = msgpack.packb(
            [
                _definition(self.index),
                sorted(msgpack.packb(list(eq)) for eq in self.eqs),  # an __in list is a set
                list(self.lower or ()),
                list(self.upper or ()),
                self.descending,
            ],
            use_bin_type=True,
        )
        return hashlib.blake2b(data, digest_size=8).digest()

    @functools.cached_property
    def one_row_per_entity(self) -> bool:
        """At most one index row of an entity can match: no multi-valued property, or
        one fixed by a single equality prefix (so no "first match" to look for)."""
        multi = self.index.multi_pos
        return multi is None or (multi < self.k and len(self.eqs) == 1)

    @property
    def k(self) -> int:
        """How many properties the equality prefix fixes."""
        return len(self.eqs[0])

    def order_key(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """A row's place in the query's order: the columns after the prefix, then (for
        an ``__in`` list) the prefix, which tells apart the rows of one entity when its
        multi-valued property is in the prefix."""
        k = self.k
        return (row[k:], row[:k])

    def follows(self, eq: tuple[Any, ...], after: tuple[Any, ...]) -> bool:
        """Whether the rows of prefix ``eq`` come after those of ``after``'s prefix
        where they tie on every other column."""
        other = after[: self.k]
        return eq < other if self.descending else eq > other

    @functools.cached_property
    def _eq_set(self) -> frozenset[tuple[Any, ...]]:
        return frozenset(self.eqs)

    def shard(self, eq: tuple[Any, ...], n_shards: int) -> int | None:
        """The one logical shard an equality prefix touches, if it fixes ``shard_on``."""
        pos = self.index.shard_pos
        if pos < len(eq):
            return shard_of(key_encode(eq[pos]), n_shards)
        return None

    def matches(self, row: tuple[Any, ...]) -> bool:
        """Whether an index row (coerced values) satisfies the query."""
        k = self.k
        if row[:k] not in self._eq_set:
            return False
        if self.lower is None and self.upper is None:
            return True
        value = row[k]
        if self.bounds is not None and not self.bounds[0] <= value < self.bounds[1]:
            return False
        if self.lower is not None:
            low, inclusive = self.lower
            if value < low or (value == low and not inclusive):
                return False
        if self.upper is not None:
            high, inclusive = self.upper
            if value > high or (value == high and not inclusive):
                return False
        # The range is exact; this re-checks a prefix on the stored value.
        return self.prefix is None or bool(value.startswith(self.prefix))


class QueryEngine:
    """Runs queries for one datastore: index rows from the servers (``cluster``), the
    entities they name from ``reader``, each page within a call of ``calls``."""

    def __init__(self, cluster: Cluster, reader: Reader, calls: Calls) -> None:
        self.cluster = cluster
        self.reader = reader
        self.calls = calls

    def resolve(self, index: Index | str, include_building: bool) -> Index:
        """The catalog's definition of an index usable by a query."""
        name = index.name if isinstance(index, Index) else index
        if not isinstance(name, str):
            raise InvalidQuery(f"expected an Index or an index name, got {type(name).__name__}")
        info = self.cluster.current().indexes.get(name)
        if info is None:
            info = self.cluster.refresh().indexes.get(name)
        if info is None:
            raise InvalidQuery(f"no index named {name!r}")
        if isinstance(index, Index) and index != info.index:
            raise InvalidQuery(f"index {name!r} in the catalog differs from the one given")
        if info.state == IndexState.DROPPED or (
            info.state == IndexState.BUILDING and not include_building
        ):
            raise IndexNotReady(
                f"index {name!r} is {info.state}"
                + (
                    "; run `cleaner --index=" + name + "` or pass include_building=True"
                    if info.state == IndexState.BUILDING
                    else ""
                )
            )
        return info.index

    # -- planning ------------------------------------------------------------------------

    def plan(
        self,
        index: Index | str,
        conditions: Mapping[str, Any],
        order: str,
        limit: int,
        include_building: bool,
        partial: bool = False,
        consistency: str = "primary",
    ) -> Query:
        """Check the conditions against the index and coerce their values."""
        idx = self.resolve(index, include_building)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidQuery(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
        eq, ranges, in_prop = _conditions(idx, conditions)
        k = len(eq)
        if set(eq) != set(idx.properties[:k]):
            raise InvalidQuery(
                f"equality conditions must fix a prefix of index {idx.name!r} "
                f"({', '.join(idx.properties)}); got {', '.join(eq) or 'none'}"
            )
        lower, upper, bounds = _range(idx, k, ranges)
        prefix = next((ops["startswith"] for ops in ranges.values() if "startswith" in ops), None)
        descending = self._direction(idx, k, order)
        if consistency not in ("primary", "replica"):
            raise InvalidQuery(f"consistency must be 'primary' or 'replica', got {consistency!r}")
        eqs = [()]  # type: list[tuple[Any, ...]]
        for p in idx.properties[:k]:
            options = eq[p] if p == in_prop else [eq[p]]
            eqs = [(*prefix, v) for prefix in eqs for v in options]
        return Query(
            idx,
            tuple(eqs),
            lower,
            upper,
            bounds,
            descending,
            limit,
            partial,
            consistency,
            prefix,
        )

    @staticmethod
    def _direction(idx: Index, k: int, order: str) -> bool:
        if order in ("asc", "desc"):
            return order == "desc"
        if isinstance(order, str):
            prop = order.lstrip("+-")
            expected = idx.properties[k] if k < len(idx.properties) else None
            if prop == expected:
                return order.startswith("-")
        raise InvalidQuery(
            f"order must be 'asc', 'desc' or [-]<the first property after the equality "
            f"prefix> of index {idx.name!r}; got {order!r}"
        )

    # -- running -------------------------------------------------------------------------

    def page(self, q: Query, cursor: str | None) -> Page:
        """One page of at most ``q.limit`` matching entities."""
        position = self._decode_cursor(q, cursor) if cursor else None
        out: list[Entity] = []
        missing: set[int] = set()
        while True:
            want = q.limit - len(out)
            batch, exhausted, gone = self._scan(q, position, want + max(4, want // 4))
            missing |= gone
            done = 0
            while done < len(batch):  # fetch only as many candidates as the page needs
                chunk = batch[done : done + q.limit - len(out)]
                done += len(chunk)
                entities, gone = self.reader.fetch(
                    {row[-1] for row in chunk}, q.consistency, partial=q.partial
                )
                missing |= gone
                for row in chunk:
                    position = row
                    entity = entities.get(row[-1])
                    if entity is not None and self._keep(q, row, entity):
                        out.append(entity)
                        if len(out) == q.limit:
                            more = not exhausted or row is not batch[-1]
                            return Page(
                                out,
                                self._encode_cursor(q, row) if more else None,
                                tuple(sorted(missing)),
                            )
            if exhausted:
                return Page(out, None, tuple(sorted(missing)))

    def iterate(self, q: Query, timeout: float | None = None) -> Iterator[Entity]:
        """Every matching entity, page by page (each within ``timeout``)."""
        cursor: str | None = None
        while True:
            page = self.calls.call(functools.partial(self.page, q, cursor), timeout)
            yield from page
            if page.cursor is None:
                return
            cursor = page.cursor

    def _keep(self, q: Query, row: tuple[Any, ...], entity: Entity) -> bool:
        """The re-filter: the stored entity produces this row, and it is its first match."""
        values = row[:-1]
        if q.one_row_per_entity:
            return q.matches(values) and _produces(q.index, entity, values)
        try:
            produced = q.index.rows(entity)
        except InvalidEntity:
            return False
        if values not in produced or not q.matches(values):
            return False
        order = q.order_key
        matching = [r for r in produced if q.matches(r)]
        first = max(matching, key=order) if q.descending else min(matching, key=order)
        return first == values

    def _scan(
        self, q: Query, after: tuple[Any, ...] | None, n: int
    ) -> tuple[list[tuple[Any, ...]], bool, set[int]]:
        """The first ``n`` index rows after ``after`` in query order, merged over shards.

        Returns (rows as (values..., entity_id), whether the index is exhausted, shards
        that did not answer).
        """
        topo = self.cluster.current()
        groups: dict[int, list[Part]] = {}  # per server: (its logical shards, prefix)
        for eq in q.eqs:
            only = q.shard(eq, topo.n_shards)
            if only is not None:
                groups.setdefault(topo.shard_servers[only], []).append(((only,), eq))
                continue
            for sid, shards in topo.placed.items():  # computed once per map
                groups.setdefault(sid, []).append((shards, eq))
        build = self._scan_sql(q, topo.dbs, after, n, topo.owned_db)
        results, errors, _ = self.cluster.scatter(
            topo, groups, build, consistency=q.consistency, partial=q.partial
        )
        unreachable_only(errors)
        gone = {shard for sid in errors for shards, _ in groups[sid] for shard in shards}
        rows: list[tuple[Any, ...]] = []
        exhausted = True
        for result in results.values():
            got: Sequence[tuple[Any, ...]] = result[0]
            rows += got
            if len(got) >= n:
                exhausted = False  # that server may hold more
        rows.sort(key=q.order_key, reverse=q.descending)
        if len(rows) > n:
            rows, exhausted = rows[:n], False
        return rows, exhausted, gone

    def _scan_sql(
        self,
        q: Query,
        dbs: Sequence[str],
        after: tuple[Any, ...] | None,
        n: int,
        owned: str | None = None,
    ) -> Callable[[list[Part]], Statement]:
        """How to scan one server's ``(shards, prefix)`` parts: one statement whose
        parts the server merges (n rows come back, not n each).  In the owned layout
        (``owned``: the data database) one part per prefix reads all its shards of the
        server in the index's order, and the batch ends with the ownership check."""
        columns = q.index.columns
        cols = ", ".join(quote(c) for c in columns)
        k = q.k
        direction = " DESC" if q.descending else ""
        order = ", ".join(f"{quote(c)}{direction}" for c in (*columns[k:], "entity_id"))
        merged = order  # the order of the server's merge; an __in list's prefix breaks ties
        if len(q.eqs) > 1:
            merged = ", ".join([order, *(f"{quote(c)}{direction}" for c in columns[:k])])
        # The same for every value of an __in list, but for its values that follow the
        # cursor's prefix: those still owe the rows that tie with the cursor's.
        where, rest = self._where(q, after)
        tails = [f"{w} ORDER BY {order} LIMIT {int(n)}" for w in where]
        table = q.index.table
        tail = f" ORDER BY {merged} LIMIT {int(n)}"
        scatters = q.index.shard_pos >= k  # each server's part: all its shards of the map

        def build(group: list[Part]) -> Statement:
            parts = []
            params: list[Any] = []
            for shards, eq in _one_each(group) if owned is None else group:
                end = tails[after is not None and len(q.eqs) > 1 and q.follows(eq, after)]
                if owned is None:
                    source = f"{quote(dbs[shards[0]], table)} WHERE"
                else:  # the key's order, never the shard key's (a merge over shards)
                    which = _owned_shards(owned, shards, scatters)
                    source = f"{quote(owned, table)} FORCE INDEX (PRIMARY) WHERE {which} AND"
                parts.append(f"SELECT {cols}, `entity_id` FROM {source} {end}")
                params += eq
                params += rest
            # bare: in parentheses it costs the server about 7 µs more
            sql = parts[0] if len(parts) == 1 else union_all([f"({p})" for p in parts], tail)
            return guarded([sql], owned, _named(group)), params

        return build

    @staticmethod
    def _where(q: Query, after: tuple[Any, ...] | None) -> tuple[tuple[str, str], list[Any]]:
        """A scan's WHERE clause, strictly after the cursor's row and from it on, and
        their parameters after the equality prefix's."""
        cols = q.index.columns
        k = q.k
        params: list[Any] = []
        if k < len(cols):
            if q.bounds is not None:
                params += q.bounds
            if q.lower is not None:
                params.append(q.lower[0])
            if q.upper is not None:
                params.append(q.upper[0])
        if after is not None:
            values = after[k:]
            for i in range(len(cols) - k + 1):
                params += values[: i + 1]
        lower = None if q.lower is None else q.lower[1]
        upper = None if q.upper is None else q.upper[1]
        bounded, keyset = q.bounds is not None, after is not None
        sql = tuple(
            _where_sql(cols, k, bounded, lower, upper, keyset, q.descending, inclusive)
            for inclusive in (False, True)
        )
        return (sql[0], sql[1]), params

    # -- cursors -------------------------------------------------------------------------

    def _encode_cursor(self, q: Query, row: tuple[Any, ...]) -> str:
        data = msgpack.packb([_CURSOR_VERSION, q.fingerprint, list(row)], use_bin_type=True)
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    def _decode_cursor(self, q: Query, cursor: str) -> tuple[Any, ...]:
        """Parse and check an opaque cursor; anything unexpected is InvalidCursor."""
        if not isinstance(cursor, str) or len(cursor) > _MAX_CURSOR:
            raise InvalidCursor("invalid cursor")
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            version, fingerprint, row = msgpack.unpackb(raw, raw=False)
        except (ValueError, TypeError, binascii.Error, msgpack.UnpackException) as exc:
            raise InvalidCursor("invalid cursor") from exc
        if version != _CURSOR_VERSION or fingerprint != q.fingerprint:
            raise InvalidCursor("cursor belongs to another query")
        types = q.index.types
        if not isinstance(row, list) or len(row) != len(types) + 1:
            raise InvalidCursor("invalid cursor")
        for value, ctype in zip(row, types, strict=False):
            base = ctype.name.partition("(")[0]
            expected = _PY_TYPES.get(base, str if base == "str" else bytes)
            if type(value) is not expected or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise InvalidCursor("invalid cursor")
        if not isinstance(row[-1], bytes) or len(row[-1]) != 16:
            raise InvalidCursor("invalid cursor")
        return tuple(row)


@functools.lru_cache(maxsize=4096)
def _where_sql(
    cols: tuple[str, ...],
    k: int,
    bounded: bool,
    lower: bool | None,
    upper: bool | None,
    keyset: bool,
    descending: bool,
    inclusive: bool,
) -> str:
    """A scan's WHERE clause (the same for every value of an ``__in`` list): equality
    on ``k`` columns, then the range (``lower``/``upper``: inclusive or not, None when
    absent), then ``keyset``: after a cursor's row in the index order (or from it on,
    ``inclusive``)."""
    clauses = [f"{quote(c)} = %s" for c in cols[:k]] or ["TRUE"]
    if k < len(cols):
        col = quote(cols[k])
        if bounded:
            clauses.append(f"{col} >= %s AND {col} < %s")
        if lower is not None:
            clauses.append(f"{col} {'>=' if lower else '>'} %s")
        if upper is not None:
            clauses.append(f"{col} {'<=' if upper else '<'} %s")
    if keyset:
        names = [quote(c) for c in (*cols[k:], "entity_id")]
        op = "<" if descending else ">"
        ors = []
        for i, col in enumerate(names):
            last = inclusive and i == len(names) - 1
            ands = [f"{c} = %s" for c in names[:i]] + [f"{col} {op}{'=' if last else ''} %s"]
            ors.append("(" + " AND ".join(ands) + ")")
        clauses.append("(" + " OR ".join(ors) + ")")
    return " AND ".join(clauses)


def _conditions(
    idx: Index, conditions: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], str | None]:
    """A query's conditions, checked and coerced: equalities by property (a list for
    the ``__in`` one), range bounds by property and operator, the ``__in`` property."""
    eq: dict[str, Any] = {}
    ranges: dict[str, dict[str, Any]] = {}
    in_prop: str | None = None
    for key, value in conditions.items():
        prop, op = _split(key, idx.properties)
        if prop not in idx.properties:
            raise InvalidQuery(
                f"index {idx.name!r} has no property {prop!r} "
                f"(its properties: {', '.join(idx.properties)})"
            )
        if op in ("", "in") and prop in eq:
            raise InvalidQuery(f"two equality conditions on {prop!r}")
        if not op:
            eq[prop] = idx.coerce_query_value(prop, value)
        elif op == "in":
            if in_prop is not None:
                raise InvalidQuery("at most one __in condition per query")
            if not isinstance(value, (list, tuple, set, frozenset)) or not (
                1 <= len(value) <= MAX_IN
            ):
                raise InvalidQuery(f"{key} takes a list of 1 to {MAX_IN} values")
            in_prop = prop
            eq[prop] = list(dict.fromkeys(idx.coerce_query_value(prop, v) for v in value))
        elif op == "between":
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                raise InvalidQuery(f"{key} takes a pair (low, high)")
            _bound(ranges, prop, "gte", idx.coerce_query_value(prop, value[0]))
            _bound(ranges, prop, "lte", idx.coerce_query_value(prop, value[1]))
        elif op in _OPS:
            _bound(ranges, prop, op, idx.coerce_query_value(prop, value))
        elif op == "startswith":
            _bound(ranges, prop, op, prefix_value(idx, prop, key, value))
        else:
            raise InvalidQuery(
                f"unknown operator {op!r} in {key!r}: use in, gt, gte, lt, lte, between "
                "or startswith"
            )
    return eq, ranges, in_prop


def _split(key: str, properties: tuple[str, ...]) -> tuple[str, str]:
    """A condition's ``prop__op`` as ``(prop, op)``: a property named with ``__`` is
    matched whole first (then ``prop__gte`` splits at its last ``__``)."""
    if key in properties or "__" not in key:
        return key, ""
    prop, _, op = key.rpartition("__")
    return prop, op


def _range(
    idx: Index, k: int, ranges: dict[str, dict[str, Any]]
) -> tuple[tuple[Any, bool] | None, tuple[Any, bool] | None, tuple[bytes, bytes] | None]:
    """The range on the property after the equality prefix: ``(lower, upper, bounds)``
    (bounds: an auto column's range stays within one type)."""
    if not ranges:
        return None, None, None
    (prop, ops), *others = ranges.items()
    if others or k >= len(idx.properties) or prop != idx.properties[k]:
        after = idx.properties[k] if k < len(idx.properties) else "none: each has an equality"
        raise InvalidQuery(
            "a range is allowed only on the property after the equality prefix "
            f"of index {idx.name!r} ({after})"
        )
    if "startswith" in ops:
        if len(ops) > 1:
            raise InvalidQuery(
                f"{prop}__startswith does not combine with another range on {prop!r}"
            )
        end = prefix_end(ops["startswith"])
        return (ops["startswith"], True), None if end is None else (end, False), None
    lower = upper = None
    for op in ("gt", "gte"):
        if op in ops:
            lower = (ops[op], _OPS[op][1])
    for op in ("lt", "lte"):
        if op in ops:
            upper = (ops[op], _OPS[op][1])
    some = lower or upper
    assert some is not None
    bounds = idx.types[k].tag_bounds(some[0])
    if lower and upper and bounds != idx.types[k].tag_bounds(upper[0]):
        raise InvalidQuery(f"range bounds on {prop!r} are of different types")
    return lower, upper, bounds


def prefix_value(idx: Index, prop: str, key: str, value: object) -> str | bytes:
    """A ``__startswith`` value, checked: a str(N) or bytes(N) column, a value that
    fits it (a longer prefix is refused, as an equality with it is)."""
    ctype = idx.types[idx.properties.index(prop)]
    if not ctype.name.startswith(("str(", "bytes(")):
        raise InvalidQuery(
            f"{key}: startswith needs a str(N) or bytes(N) column; {prop!r} of index "
            f"{idx.name!r} is {ctype.name}"
        )
    coerced = idx.coerce_query_value(prop, value)
    assert isinstance(coerced, (str, bytes))
    return coerced


def prefix_end(prefix: str | bytes) -> str | bytes | None:
    """The least value above every value that starts with ``prefix``, in code point
    order (str: utf8mb4_nopad_bin's order) or byte order (bytes); None if there is none
    (the prefix is empty or all maximal). The values from ``prefix`` up to it, excluded,
    are exactly those that start with it."""
    if isinstance(prefix, bytes):
        raw = prefix.rstrip(b"\xff")
        return raw[:-1] + bytes((raw[-1] + 1,)) if raw else None
    text = prefix.rstrip(chr(_MAX_CHAR))
    if not text:
        return None
    nxt = ord(text[-1]) + 1
    if _SURROGATES[0] <= nxt <= _SURROGATES[1]:
        nxt = _SURROGATES[1] + 1
    return text[:-1] + chr(nxt)


#: Above this many logical shards, a server's part of a scatter reads the shards its
#: ``owned`` table names, not a list, unless the list is a short progression (a new
#: datastore's block of shards: one ``BETWEEN``): 2048 literals cost the server about
#: 2 ms a statement (a semi-join with ``owned`` 0.25 ms; a list of 8, 0.03 ms less).
OWNED_LIST_MAX = 64
#: A progression longer than this (its exceptions listed) gives way to the semi-join.
_SHORT = 256


def _named(group: list[Part]) -> Sequence[int]:
    """The logical shards a server's scan names."""
    return group[0][0] if len(group) == 1 else sorted(set().union(*(s for s, _ in group)))


def _owned_shards(owned: str, shards: tuple[int, ...], everywhere: bool) -> str:
    """The owned layout's condition that a scan reads these shards' rows.  A part that
    reads all the server's shards of the map (``everywhere``) may take those its
    ``owned`` table names instead: the batch's check fails unless each shard of the map
    is among them, and a shard owned but placed elsewhere by the map is one whose
    server of the map fails its check (a shard has one owner), so nothing is read twice
    or missed without an error."""
    named = among(shards)  # sorted: a server's shards of the map, or one
    if everywhere and len(shards) > OWNED_LIST_MAX and len(named) > _SHORT:
        return f"`shard` IN (SELECT `shard` FROM {quote(owned, 'owned')})"
    return named


def _one_each(group: list[Part]) -> list[Part]:
    """Parts of one shard each (a database per logical shard: a table each)."""
    return [((shard,), eq) for shards, eq in group for shard in shards]


def _bound(ranges: dict[str, dict[str, Any]], prop: str, op: str, value: Any) -> None:
    """Add a range bound on ``prop``; a second lower or upper bound is refused."""
    ops = ranges.setdefault(prop, {})
    if any(o[:2] == op[:2] for o in ops):  # gt/gte: lower, lt/lte: upper
        raise InvalidQuery(f"two lower or two upper bounds on {prop!r}")
    ops[op] = value


@functools.lru_cache(maxsize=1024)
def _definition(index: Index) -> str:
    return json.dumps(index.to_dict(), sort_keys=True)


def _produces(index: Index, entity: Entity, values: tuple[Any, ...]) -> bool:
    """Whether the entity produces this index row, without computing all its rows."""
    if index.filter and not index.selects(entity):
        return False
    for pos in range(len(index.properties)):
        try:
            value, target = index.lookup(entity, pos), values[pos]
        except InvalidEntity:
            return False
        if (
            type(value) is not type(target) or value != target or not index.types[pos].plain
        ) and not _column_produces(index, pos, value, target):
            return False
    return True


def _column_produces(index: Index, pos: int, value: Any, target: Any) -> bool:
    """Whether a stored property value gives ``target`` in column ``pos``."""
    if value is None:
        return False
    ctype = index.types[pos]
    try:
        if pos != index.multi_pos:
            return not isinstance(value, list) and ctype.coerce(value) == target
        if not isinstance(value, list):
            return False
        try:  # the usual case first: the stored element equals the row's value
            if ctype.coerce(value[value.index(target)]) == target:
                return True
        except ValueError:
            pass
        return any(v is not None and ctype.coerce(v) == target for v in value)
    except ValueError:
        return False
