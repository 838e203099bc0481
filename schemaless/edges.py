"""Edges with counts: a named edge type over a datastore (``likes``, ``follows``).

``Edges(ds, "likes", inverse="liked_by")``: the edge rows of ``src`` and its count row
live on ``src``'s logical shard, in two tables of the data database of every server
(owned layout only), so ``add`` and ``remove`` are one round trip per side ("non-stored
procedures": a hot node's count row is never locked across the network).  ``add``'s
side is one autocommit statement, the edge's upsert, whose ``AFTER INSERT`` trigger
counts a new edge (on a server whose tables predate that trigger: the edge and the
count by ``ROW_COUNT()`` in one transaction); ``remove``'s is the delete, then the
count changed by ``ROW_COUNT()``, in one transaction.  Both are idempotent.  The
inverse (``dst``'s edges back, on ``dst``'s shard) is a superset of the forward
edges: written first, removed last; ``repair`` removes the inverse rows an interrupted
call left behind.  When ``src``'s and ``dst``'s shards share a server, both sides go
in one batch, in that order (``_both``; docs/architecture.md, "Edges and feeds").
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgpack

from . import failpoints
from .catalogdb import now_us
from .edgetables import NOCOUNT, check_type, pairing, pairing_note, table_names, tables_sql
from .errors import (
    CatalogError,
    InvalidCursor,
    InvalidEntity,
    InvalidQuery,
    PermissionDenied,
    TableMissing,
)
from .ids import to_id
from .names import quote
from .owned import (
    guarded,
    triggered,
)
from .query import MAX_LIMIT
from .scatter import Statement, by_server, unreachable_only

if TYPE_CHECKING:
    from .catalog import Topology
    from .store import DataStore

__all__ = [
    "Edge",
    "EdgePage",
    "Edges",
    "NotCreated",
    "check_limit",
    "create_tables",
    "missing_tables",
]

T = TypeVar("T")

_CURSOR = "ec1."
_MAX_DATA = 65535
#: Inverse rows untouched this long with no forward edge are orphans (``repair``).
GRACE = 60.0
_SCAN = 500
#: Whether a table exists and has a trigger: (table, trigger) counts, 0 or 1.
_HAS_TRIGGER = (
    "SELECT (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s"
    " AND table_name = %s), (SELECT COUNT(*) FROM information_schema.triggers"
    " WHERE trigger_schema = %s AND event_object_table = %s AND trigger_name = %s)"
)
#: Where each form of a side has the edge statement's row count, from the end (before
#: ``COMMIT``, and the count and ``SET`` of ``NOCOUNT``), so also in a batch of two sides.
_EDGE_AT = {"add": -1, "add_counting": -4, "remove": -3}


@dataclass(frozen=True, slots=True)
class Edge:
    """One edge: ``src`` -> ``dst``, when it was added (microseconds) and its data."""

    src: bytes
    dst: bytes
    at: int
    data: Any = None


class NotCreated(PermissionDenied):
    """An edge type's or a feed's tables are missing and this user may not create
    them (the application's grants have no DDL): the message names the admin command
    that creates them."""


class EdgePage(list[Edge]):
    """A page of edges, newest first, with ``cursor`` for the next (None at the end)."""

    def __init__(self, items: list[Edge], cursor: str | None) -> None:
        super().__init__(items)
        self.cursor = cursor


def check_limit(limit: object) -> int:
    """A page size from 1 to ``MAX_LIMIT``."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidQuery(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def missing_tables(ds: DataStore, names: list[str]) -> bool:
    """Whether a server of the map that answers lacks one of the tables ``names`` in
    its data database (one statement per server; what this user may see, and the
    application's grants see the whole data database).  A server that is down is
    not asked again: opening an edge type or a feed costs only its shards (a call
    that meets a missing table there later creates them, ``Edges._call``)."""
    return any(len(found) < len(names) for found in _tables_found(ds, names))


def _tables_of(kinds: list[str]) -> list[str]:
    """The edge and count tables of edge types."""
    return [t for k in kinds for t in table_names(k)]


def _pairings(found: list[dict[str, str]], kinds: list[str]) -> dict[str, tuple[str, str]]:
    """The pairings recorded on the edge tables of ``kinds`` (``edgetables.pairing``),
    by type, in the tables and comments ``_tables_found`` read."""
    kind_of = {table_names(k)[0]: k for k in kinds}
    return {
        kind_of[name]: paired
        for tables in found
        for name, comment in tables.items()
        if name in kind_of and (paired := pairing(comment)) is not None
    }


def _tables_found(ds: DataStore, names: list[str]) -> list[dict[str, str]]:
    """Each answering server's tables among ``names`` in its data database, with
    their comments (one statement a server, in parallel)."""
    topo = ds.cluster.current()
    sql = (
        "SELECT `table_name`, `table_comment` FROM information_schema.tables"
        f" WHERE table_schema = %s AND table_name IN ({', '.join(['%s'] * len(names))})"
    )
    found = ds.cluster.scatter(
        topo,
        {sid: sid for sid in topo.servers},
        lambda _: (sql, [topo.owned_db, *names]),
        partial=True,
    )
    unreachable_only(found.errors)
    return [{str(n): str(c) for n, c in rows[0]} for rows in found.results.values()]


def create_tables(ds: DataStore, sql: Callable[[str], list[str]], what: str, command: str) -> None:
    """Run the DDL ``sql(db)`` of ``what`` on every server; a user without the right
    to (the application) gets ``NotCreated`` naming the admin ``command``."""
    try:
        ds.cluster.on_dbs(ds.cluster.current(), sql)
    except PermissionDenied as exc:
        raise NotCreated(
            f"{what} has no tables yet and this user may not create them: run"
            f" `{command}` once as the datastore's admin ({exc})"
        ) from exc


class _Side:
    """The SQL of one direction's tables (``edges__T`` and its counts) on one shard."""

    def __init__(self, db: str | None, kind: str) -> None:
        assert db is not None
        self.db, self.kind = db, kind
        self.edges, self.counts = (quote(db, t) for t in table_names(kind))

    def _count(self, shard: int, delta: str) -> str:
        return (
            f"INSERT INTO {self.counts} (`shard`, `node`, `n`) VALUES ({int(shard)}, %s, {delta})"
            " ON DUPLICATE KEY UPDATE `n` = `n` + VALUES(`n`)"
        )

    def _upsert(self, shard: int) -> str:
        return (
            f"INSERT INTO {self.edges} (`shard`, `src`, `dst`, `at`, `touched`, `data`)"
            f" VALUES ({int(shard)}, %s, %s, %s, %s, %s)"
            " ON DUPLICATE KEY UPDATE `touched` = VALUES(`touched`)"
        )

    def add(self, shard: int) -> str:
        """Write the edge (touched again if present): one statement, whose count
        trigger counts it if it is new; a row count of 1 is an insert (0 or 2: a
        present edge).  An upsert fires the guard's triggers, and the count's upsert
        in the trigger those of the count table: no check needed (``triggered``)."""
        return triggered([self._upsert(shard)], self.db)

    def add_counting(self, shard: int) -> str:
        """``add`` where the edge table may lack the count trigger (made before it):
        the edge's upsert, then the count by its ``ROW_COUNT()``, in one transaction,
        with ``NOCOUNT`` set so a trigger made since does not count it again.  Both
        are upserts, so both fire the guard's triggers (``triggered``)."""
        return triggered(
            [
                f"SET {NOCOUNT} = 1",
                self._upsert(shard),
                self._count(shard, "ROW_COUNT() = 1"),
                f"SET {NOCOUNT} = NULL",
            ],
            self.db,
        )

    def remove(self, shard: int, before: bool = False) -> str:
        """Delete the edge (``before``: only if untouched since a time), uncount it.
        The count's upsert fires the guard's insert trigger whatever the delete
        removed, so on a server that does not own the shard the whole batch fails,
        the delete with it (``triggered``)."""
        return triggered(self.removing(shard, before), self.db)

    def removing(self, shard: int, before: bool = False) -> list[str]:
        """``remove``'s statements, for a transaction of its own or a shared one."""
        touched = " AND `touched` < %s" if before else ""
        return [
            f"DELETE FROM {self.edges} WHERE `shard` = {int(shard)} AND `src` = %s"
            f" AND `dst` = %s{touched}",
            self._count(shard, "-ROW_COUNT()"),
        ]

    # Reads are one statement each and its verdict (``guarded``), read by ``Edges._read``.

    def count(self, shard: int) -> str:
        select = f"SELECT `n` FROM {self.counts} WHERE `shard` = {int(shard)} AND `node` = %s"
        return guarded([select], self.db, (shard,))

    def has(self, shard: int) -> str:
        select = (
            f"SELECT 1 FROM {self.edges} WHERE `shard` = {int(shard)} AND `src` = %s AND `dst` = %s"
        )
        return guarded([select], self.db, (shard,))

    def page(self, shard: int, limit: int, after: bool) -> str:
        keyset = " AND (`at` < %s OR (`at` = %s AND `dst` < %s))" if after else ""
        select = (
            f"SELECT `dst`, `at`, `data` FROM {self.edges} FORCE INDEX (`newest`)"
            f" WHERE `shard` = {int(shard)} AND `src` = %s{keyset}"
            f" ORDER BY `at` DESC, `dst` DESC LIMIT {int(limit)}"
        )
        return guarded([select], self.db, (shard,))


class Edges:
    """A named edge type over a datastore in the owned layout (module docstring).

    ``inverse``: the name of the edge type back (``likes`` -> ``liked_by``), kept on
    ``dst``'s shard.  ``create``: the tables a server lacks are created (by the first
    ``Edges`` of a type, and by a call that finds them missing: a server added since);
    that needs DDL rights, so for the application's user an admin creates them first
    (``schemaless edges create``; else ``NotCreated`` names that command).  With
    ``create`` False (tools that only read) nothing is checked up front and a type
    without tables is unknown (``InvalidQuery``).  ``timeout``: each call's deadline
    (default the datastore's).
    """

    def __init__(
        self,
        ds: DataStore,
        kind: str,
        *,
        inverse: str | None = None,
        timeout: float | None = None,
        create: bool = True,
    ) -> None:
        self.ds = ds
        self.kind = check_type(kind)
        self.inverse = None if inverse is None else check_type(inverse)
        if self.inverse == self.kind:
            raise InvalidQuery(f"edge type {kind!r} cannot be its own inverse")
        self.timeout, self.creates = timeout, create
        #: Whether a server's edge table of a type counts by its trigger, by (map
        #: version, server, type): asked once each (``_counts_itself``).
        self._counting: dict[tuple[int, int, str], bool] = {}
        if ds.cluster.refresh().owned_db is None:
            raise CatalogError(
                f"edges ({kind!r}) need the owned layout; this datastore has a database per"
                " logical shard: move it over with `schemaless dump` and `schemaless restore`"
                " into a new datastore (owned by default)"
            )
        kinds = self.kinds()
        found = _tables_found(ds, _tables_of(kinds))  # one read for both questions
        #: The type this one is the recorded inverse of (written through that one)
        self.inverse_of = self._paired(_pairings(found, kinds))
        names = _tables_of(self.kinds())
        if self.kinds() != kinds:  # the recorded inverse taken: its tables asked too
            found = _tables_found(ds, names)
        if create and any(len(tables) < len(names) for tables in found):
            self.create()

    def _paired(self, recorded: dict[str, tuple[str, str]]) -> str | None:
        """Check ``inverse`` against the pairings recorded with the tables: a type made
        with an inverse keeps it (opened without one, it is taken); a type that is
        another's inverse has none of its own (returned: the type it is the inverse
        of); ``InvalidQuery`` for any other pairing.  Tables made before pairings were
        recorded have none: the caller's is taken."""
        mine, theirs = recorded.get(self.kind), recorded.get(str(self.inverse))
        kind = self.kind
        if mine is not None and mine[0] == "inverse":
            if self.inverse not in (None, mine[1]):
                made = f"edge type {kind!r} was made with the inverse {mine[1]!r}"
                raise InvalidQuery(f"{made}, not {self.inverse!r}")
            self.inverse = mine[1]
            return None
        if mine is not None:
            if self.inverse is not None:
                raise InvalidQuery(
                    f"edge type {kind!r} is the inverse of {mine[1]!r} and has none of its"
                    f" own: add and remove through edge type {mine[1]!r}, which writes both"
                )
            return mine[1]
        if theirs is not None and theirs != ("inverse of", kind):
            role = "the inverse of" if theirs[0] == "inverse of" else "made with the inverse"
            said = f"{role} {theirs[1]!r}"
            raise InvalidQuery(
                f"edge type {self.inverse!r} is {said}: it cannot be {kind!r}'s inverse"
            )
        return None

    def create(self) -> None:
        """Create this type's tables (and its inverse's) on every server, recording
        their pairing (idempotent); ``NotCreated`` for a user without the right to."""
        notes = {self.kind: "", **({} if self.inverse is None else self._notes(self.inverse))}
        create_tables(
            self.ds,
            lambda db: [s for k, note in notes.items() for s in tables_sql(db, k, note)],
            f"edge type {'/'.join(notes)!r}",
            self.command(),
        )

    def _notes(self, inverse: str) -> dict[str, str]:
        return {
            self.kind: pairing_note("inverse", inverse),
            inverse: pairing_note("inverse of", self.kind),
        }

    def command(self) -> str:
        """The admin command that creates this type's tables."""
        inverse = "" if self.inverse is None else f" --inverse {self.inverse}"
        return f"schemaless edges create {self.kind}{inverse}"

    def kinds(self) -> list[str]:
        """This type and its inverse (if any)."""
        return [self.kind] if self.inverse is None else [self.kind, self.inverse]

    # -- writes -------------------------------------------------------------------------

    def add(self, src: Any, dst: Any, data: Any = None) -> bool:
        """Add the edge ``src`` -> ``dst``; whether it is new (adding a present edge
        changes no count, time or data).  ``data``: any msgpack value (at most 64 KiB
        packed), kept with the edge."""
        self._writable()
        src, dst, packed = to_id(src), to_id(dst), _pack(data)
        at = now_us()
        more = (at, at, packed)
        if self.inverse is not None:
            both = self._both("add", src, dst, more)
            if both is not None:
                return both == 1
            self._write(self.inverse, "add", dst, src, more)
            failpoints.hit("edges.between_sides")
        return self._write(self.kind, "add", src, dst, more) == 1

    def remove(self, src: Any, dst: Any) -> bool:
        """Remove the edge (a missing one: nothing changes); whether it was there."""
        self._writable()
        src, dst = to_id(src), to_id(dst)
        if self.inverse is not None:
            both = self._both("remove", src, dst, ())
            if both is not None:
                return both == 1
        gone = self._write(self.kind, "remove", src, dst, ()) == 1
        if self.inverse is not None:
            failpoints.hit("edges.between_sides")
            self._write(self.inverse, "remove", dst, src, ())
        return gone

    def _write(self, kind: str, op: str, node: bytes, other: bytes, more: tuple[Any, ...]) -> int:
        """One side's write on ``node``'s shard; the edge statement's row count."""

        def run(topo: Topology, shard: int) -> int:
            sql, params, at = self._side(topo, shard, kind, op, (node, other, *more))
            counts: list[int] = []
            self.ds.cluster.server_of_shard(topo, shard).run(
                sql, params, commits=True, counts=counts
            )
            return counts[at]

        return self._call(node, run)

    def _side(
        self, topo: Topology, shard: int, kind: str, op: str, params: tuple[Any, ...]
    ) -> tuple[str, tuple[Any, ...], int]:
        """One side's SQL on ``shard``, its parameters (``params``: the node, the other
        end and ``more``), and where its edge statement's row count is (from the end)."""
        if op == "add" and not self._counts_itself(topo, shard, kind):
            op, params = "add_counting", (*params, params[0])
        elif op == "remove":
            params = (*params, params[0])
        return _write_sql(topo.owned_db, kind, op, shard), params, _EDGE_AT[op]

    def _both(self, op: str, src: bytes, dst: bytes, more: tuple[Any, ...]) -> int | None:
        """``add`` or ``remove`` of an edge with an inverse as one batch, when the
        shards of ``src`` and ``dst`` share a server: the sides in ``add``'s and
        ``remove``'s order (docs/architecture.md, "Edges and feeds"); the forward
        edge statement's row count, or None when they do not share one (then the
        caller sends a side at a time).  ``add``: the inverse's side, then the
        forward's, each committed by itself; ``remove``: the forward's statements,
        then the inverse's, in one transaction (its row count is the answer, and a
        deadlock's resend of a batch whose first side had committed would lose it)."""
        n_of = self.ds.cluster.shard_of_id
        other = n_of(dst)  # the hash of an id, the same on every map
        if not _together(self.ds.cluster.current(), n_of(src), other):
            return None
        inverse = self._inverse()

        def run(topo: Topology, shard: int) -> int | None:
            if not _together(topo, shard, other):
                return None  # the map changed since: a side at a time
            at = 1
            if op == "remove":
                sql = _removing_sql(topo.owned_db, (self.kind, inverse), (shard, other))
                # each side's delete (node, other end), then its count (node)
                params: tuple[Any, ...] = (src, dst, src, dst, src, dst)
            else:
                first, params, _ = self._side(topo, other, inverse, op, (dst, src, *more))
                last, tail, at = self._side(topo, shard, self.kind, op, (src, dst, *more))
                sql, params = f"{first};\n{last}", params + tail
            counts: list[int] = []
            self.ds.cluster.server_of_shard(topo, shard).run(
                sql, params, commits=True, counts=counts
            )
            return counts[at]

        return self._call(src, run)

    def _counts_itself(self, topo: Topology, shard: int, kind: str) -> bool:
        """Whether ``kind``'s edge table on the server of ``shard`` has the count
        trigger (tables made before it have not), asked once per map version
        (``information_schema``, which shows the application's user the triggers of
        the tables it may write; a server without the table yet is asked again after
        the call that creates it).  Until a server whose tables
        ``schemaless edges create`` gave the trigger since is asked again (a new map,
        a new ``Edges``) it gets the transaction, which counts right either way
        (``NOCOUNT``)."""
        key = (topo.map_version, topo.shard_servers[shard], kind)
        known = self._counting.get(key)
        if known is None:
            edges = table_names(kind)[0]
            rows = self.ds.cluster.server_of_shard(topo, shard).run(
                _HAS_TRIGGER, (topo.owned_db, edges, topo.owned_db, edges, f"{edges}_ci")
            )
            table, known = (int(n) == 1 for n in rows[0][0])
            if table:
                self._counting[key] = known
        return known

    # -- reads --------------------------------------------------------------------------

    def has(self, src: Any, dst: Any) -> bool:
        """Whether the edge ``src`` -> ``dst`` exists."""
        ids = (to_id(src), to_id(dst))
        return bool(self._read(self.kind, ids[0], lambda s: s.has, ids))

    def count(self, src: Any) -> int:
        """How many edges leave ``src``."""
        return self._count(self.kind, to_id(src))

    def count_inverse(self, dst: Any) -> int:
        """How many edges reach ``dst`` (the inverse's count)."""
        return self._count(self._inverse(), to_id(dst))

    def counts_inverse(self, dsts: Iterable[Any]) -> dict[bytes, int]:
        """How many edges reach each of ``dsts``, one statement per server."""
        nodes = sorted({to_id(d) for d in dsts})
        kind = self._inverse()

        def run() -> dict[bytes, int]:
            topo = self.ds.cluster.current()
            side = _Side(topo.owned_db, kind)
            n_of = self.ds.cluster.shard_of_id

            def build(group: list[bytes]) -> Statement:
                shards = sorted({n_of(n) for n in group})
                sql = (
                    f"SELECT `node`, `n` FROM {side.counts} WHERE `shard` IN"
                    f" ({', '.join(str(s) for s in shards)})"
                    f" AND `node` IN ({', '.join(['%s'] * len(group))})"
                )
                return guarded([sql], side.db, shards), group

            results = self.ds.cluster.scatter(topo, by_server(topo, nodes, n_of), build).results
            return {bytes(k): int(n) for rows in results.values() for k, n in rows[0]}

        found = self.ds.calls.call(run, self.timeout) if nodes else {}
        return {n: found.get(n, 0) for n in nodes}

    def page(self, src: Any, limit: int = 20, cursor: str | None = None) -> EdgePage:
        """The edges leaving ``src``, newest first, and the next page's cursor."""
        return self._page(self.kind, to_id(src), check_limit(limit), cursor, forward=True)

    def page_inverse(self, dst: Any, limit: int = 20, cursor: str | None = None) -> EdgePage:
        """The edges reaching ``dst`` (``Edge.src`` the other end), newest first."""
        return self._page(self._inverse(), to_id(dst), check_limit(limit), cursor, forward=False)

    def sources(self, dst: Any, chunk: int = 5000) -> Iterator[list[bytes]]:
        """Every node with an edge reaching ``dst`` (the inverse), newest first, in
        lists of ``chunk`` (one round trip each): a fan-out's reader."""
        dst, kind = to_id(dst), self._inverse()
        params: tuple[Any, ...] = (dst,)
        while True:  # the page's statement, without an Edge (or data unpacked) per row
            rows = self._read(kind, dst, _paged(chunk + 1, len(params) > 1), params)
            yield [bytes(r[0]) for r in rows[:chunk]]
            if len(rows) <= chunk:
                return
            last = rows[chunk - 1]
            params = (dst, int(last[1]), int(last[1]), bytes(last[0]))

    def _writable(self) -> None:
        """``InvalidQuery`` for a write through a type that is another's inverse (its
        edges are written with that type's, so its pairs stay whole)."""
        if self.inverse_of is not None:
            raise InvalidQuery(
                f"edge type {self.kind!r} is the inverse of {self.inverse_of!r}: add and"
                f" remove through Edges(ds, {self.inverse_of!r}), which writes both"
            )

    def _inverse(self) -> str:
        if self.inverse is None:
            raise InvalidQuery(f"edge type {self.kind!r} has no inverse")
        return self.inverse

    def _count(self, kind: str, node: bytes) -> int:
        rows = self._read(kind, node, lambda s: s.count, (node,))
        return int(rows[0][0]) if rows else 0

    def _page(
        self, kind: str, node: bytes, limit: int, cursor: str | None, *, forward: bool
    ) -> EdgePage:
        params: tuple[Any, ...] = (node,)
        if cursor is not None:
            at, dst = _decode_cursor(cursor, kind, node)
            params = (node, at, at, dst)
        rows = self._read(
            kind, node, lambda s: lambda sh: s.page(sh, limit + 1, cursor is not None), params
        )
        items = [
            Edge(node, bytes(o), int(a), _unpack(d))
            if forward
            else Edge(bytes(o), node, int(a), _unpack(d))
            for o, a, d in rows[:limit]
        ]
        end = rows[limit - 1] if len(rows) > limit else None
        return EdgePage(items, None if end is None else _cursor(kind, node, end[1], bytes(end[0])))

    def _read(
        self,
        kind: str,
        node: bytes,
        sql: Callable[[_Side], Callable[[int], str]],
        params: tuple[Any, ...],
    ) -> list[Any]:
        def run(topo: Topology, shard: int) -> list[Any]:
            stmt = sql(_Side(topo.owned_db, kind))(shard)
            return list(self.ds.cluster.server_of_shard(topo, shard).run(stmt, params)[0])

        return self._call(node, run)

    def _call(self, node: bytes, fn: Callable[[Topology, int], T]) -> T:
        """``fn(topo, shard of node)`` within a call's deadline, following the map; the
        tables created once if a server has none yet (added since)."""

        def once() -> T:
            topo = self.ds.cluster.current()
            return fn(topo, self.ds.cluster.shard_of_id(node))

        try:
            return self.ds.calls.call(once, self.timeout)
        except TableMissing as exc:
            if "doesn't exist" not in str(exc):
                raise
            if not self.creates:
                raise InvalidQuery(
                    f"unknown edge type {'/'.join(self.kinds())!r}: its tables do not"
                    f" exist (`{self.command()}` creates them)"
                ) from None
            self.create()
            return self.ds.calls.call(once, self.timeout)

    # -- repair -------------------------------------------------------------------------

    def repair(self, grace: float = GRACE) -> int:
        """Remove inverse edges with no forward edge that were not touched for
        ``grace`` seconds (left by an ``add`` or ``remove`` cut between its sides);
        how many.  Forward edges are never missing their inverse (the inverse is
        written first and removed last), and counts change with their rows."""
        inverse = self._inverse()
        cutoff = now_us() - int(grace * 1e6)
        removed = 0
        for orphans in self._orphans(inverse, cutoff):
            for node, other in orphans:

                def run(topo: Topology, shard: int, n: bytes = node, o: bytes = other) -> int:
                    counts: list[int] = []
                    self.ds.cluster.server_of_shard(topo, shard).run(
                        _Side(topo.owned_db, inverse).remove(shard, before=True),
                        (n, o, cutoff, n),
                        commits=True,
                        counts=counts,
                    )
                    return counts[1]

                removed += self._call(node, run)
        return removed

    def _orphans(self, inverse: str, cutoff: int) -> Iterator[list[tuple[bytes, bytes]]]:
        """Chunks of inverse rows ``(dst, src)`` older than ``cutoff`` whose forward
        edge ``src`` -> ``dst`` is missing."""
        for shard in range(self.ds.cluster.current().n_shards):
            after: tuple[bytes, bytes] | None = None
            while True:
                rows = self._scan(inverse, shard, cutoff, after)
                if not rows:
                    break
                after = rows[-1]
                present = self._present([(o, n) for n, o in rows])
                yield [(n, o) for n, o in rows if (o, n) not in present]

    def _scan(
        self, kind: str, shard: int, cutoff: int, after: tuple[bytes, bytes] | None
    ) -> list[tuple[bytes, bytes]]:
        keyset = " AND (`src` > %s OR (`src` = %s AND `dst` > %s))" if after else ""
        params: tuple[Any, ...] = (cutoff,) if after is None else (cutoff, after[0], *after)

        def run(topo: Topology, _: int) -> list[tuple[bytes, bytes]]:
            side = _Side(topo.owned_db, kind)
            sql = guarded(
                [
                    f"SELECT `src`, `dst` FROM {side.edges} WHERE `shard` = {int(shard)}"
                    f" AND `touched` < %s{keyset} ORDER BY `src`, `dst` LIMIT {_SCAN}"
                ],
                side.db,
                (shard,),
            )
            rows = self.ds.cluster.server_of_shard(topo, shard).run(sql, params)[0]
            return [(bytes(s), bytes(d)) for s, d in rows]

        return self.ds.calls.call(lambda: run(self.ds.cluster.current(), shard), self.timeout)

    def _present(self, pairs: list[tuple[bytes, bytes]]) -> set[tuple[bytes, bytes]]:
        """Which forward edges ``(src, dst)`` exist, one statement per server."""

        def run() -> set[tuple[bytes, bytes]]:
            topo = self.ds.cluster.current()
            side = _Side(topo.owned_db, self.kind)
            n_of = self.ds.cluster.shard_of_id

            def build(group: list[tuple[bytes, bytes]]) -> Statement:
                shards = {n_of(s) for s, _ in group}
                marks = ", ".join(["(%s, %s)"] * len(group))
                sql = (
                    f"SELECT `src`, `dst` FROM {side.edges} WHERE `shard` IN"
                    f" ({', '.join(str(s) for s in sorted(shards))})"
                    f" AND (`src`, `dst`) IN ({marks})"
                )
                return guarded([sql], side.db, shards), [v for p in group for v in p]

            groups = by_server(topo, pairs, lambda p: n_of(p[0]))
            results = self.ds.cluster.scatter(topo, groups, build).results
            return {(bytes(s), bytes(d)) for rows in results.values() for s, d in rows[0]}

        return self.ds.calls.call(run, self.timeout) if pairs else set()


@functools.lru_cache(maxsize=4096)
def _write_sql(db: str | None, kind: str, op: str, shard: int) -> str:
    """One side's ``add``, ``add_counting`` or ``remove`` statement or batch on a
    shard, built once (the same for every call of a map: only the data database's
    name varies)."""
    side = _Side(db, kind)
    write: Callable[[int], str] = getattr(side, op)
    return write(shard)


@functools.lru_cache(maxsize=4096)
def _removing_sql(db: str | None, kinds: tuple[str, str], shards: tuple[int, int]) -> str:
    """``remove`` of both sides in one transaction: the forward's statements on
    ``shards[0]``, then the inverse's on ``shards[1]`` (the delete's row count at 1)."""
    forward, inverse = (_Side(db, k).removing(s) for k, s in zip(kinds, shards, strict=True))
    return triggered([*forward, *inverse], db)


def _together(topo: Topology, shard: int, other: int) -> bool:
    """Whether two shards live on the same server of the map."""
    return topo.shard_servers[shard] == topo.shard_servers[other]


def _paged(limit: int, after: bool) -> Callable[[_Side], Callable[[int], str]]:
    """A page's statement of ``limit`` rows (``after``: past a keyset position)."""
    return lambda side: lambda shard: side.page(shard, limit, after)


def _pack(data: Any) -> bytes | None:
    if data is None:
        return None
    try:
        packed: bytes = msgpack.packb(data, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEntity(f"edge data must be msgpack-serialisable: {exc}") from None
    if len(packed) > _MAX_DATA:
        raise InvalidEntity(f"edge data is {len(packed)} bytes packed, at most {_MAX_DATA}")
    return packed


def _unpack(raw: bytes | None) -> Any:
    return None if raw is None else msgpack.unpackb(raw, raw=False)


def pack_cursor(tag: str, fields: list[Any]) -> str:
    """A page cursor: ``tag`` (which kind of page) and its fields, URL-safe."""
    raw = msgpack.packb(fields, use_bin_type=True)
    return tag + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def unpack_cursor(cursor: object, tag: str, what: str) -> Any:
    """The fields of a cursor ``pack_cursor(tag, ...)`` made; ``InvalidQuery`` (naming
    ``what`` it should have been) for anything else."""
    if not isinstance(cursor, str) or not cursor.startswith(tag):
        raise InvalidCursor(f"not {what}: {str(cursor)[:40]!r}")
    text = cursor[len(tag) :]
    try:
        return msgpack.unpackb(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)), raw=False)
    except (ValueError, msgpack.UnpackException):  # its reason says nothing to a user
        raise InvalidCursor(f"not {what}: {cursor[:40]!r}") from None


def _cursor(kind: str, node: bytes, at: int, last: bytes) -> str:
    return pack_cursor(_CURSOR, [kind, node, at, last])


def _decode_cursor(cursor: object, kind: str, node: bytes) -> tuple[int, bytes]:
    """The position of a cursor of this edge type and node; ``InvalidQuery`` for
    anything else (malformed, or another type's or node's page)."""
    got = unpack_cursor(cursor, _CURSOR, "an edge page cursor")
    if not (
        isinstance(got, list)
        and len(got) == 4
        and isinstance(got[2], int)
        and isinstance(got[3], bytes)
        and len(got[3]) == 16
    ):
        raise InvalidCursor(f"not an edge page cursor: {str(cursor)[:40]!r}")
    if got[0] != kind or got[1] != node:
        raise InvalidCursor(f"this cursor pages another node's or edge type's edges, not {kind!r}")
    return got[2], got[3]
