"""The scatter: group work by server, one statement batch per server, send them all,
gather; and the one packet budget that splits work into batches that fit.

Every multi-shard read and write goes through here (a put's steps, ``get_many``, a
query's scan, the Cleaner's reads and repairs): ``by_server`` groups items by the
server of their logical shard, ``scatter`` builds and runs one batch per server
(servers in parallel, ``connection.gather``), ``rounds`` runs a list of batches per
server in turn.  ``chunks`` cuts a list so that each part's SQL, as ``sql_bytes``
estimates it, stays within a budget (the servers' ``max_allowed_packet``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from .catalog import Topology
from .connection import Batch, Rows, Server, gather, gather_partial
from .errors import SchemalessError, ShardUnavailable
from .hashing import shard_of
from .index import Index
from .names import quote
from .owned import guarded
from .tables import union_all

__all__ = [
    "ID_BYTES",
    "STATEMENT_BYTES",
    "Scattered",
    "Statement",
    "added_page_sql",
    "bare",
    "by_server",
    "chunks",
    "dbs_by_server",
    "ids_by_server",
    "joined",
    "rounds",
    "row_bytes",
    "scatter",
    "server_reads",
    "shard_is",
    "shard_unions",
    "sql_bytes",
    "unreachable_only",
]

T = TypeVar("T")
G = TypeVar("G")

#: SQL and its parameters: one server's batch.
Statement = tuple[str, Sequence[Any]]

#: At most the text of one statement around its values (table names, keywords).
STATEMENT_BYTES = 512


class Scattered(NamedTuple):
    """What a scatter brought back, by server id: result sets, and (``partial``) the
    servers that failed with their errors; (``commits``) affected-row counts."""

    results: dict[int, Rows]
    errors: dict[int, SchemalessError]
    counts: dict[int, list[int]]


def by_server(topo: Topology, items: Iterable[T], shard: Callable[[T], int]) -> dict[int, list[T]]:
    """``items`` grouped by the server of their logical shard, in order."""
    shard_servers = topo.shard_servers
    out: dict[int, list[T]] = {}
    for item in items:
        out.setdefault(shard_servers[shard(item)], []).append(item)
    return out


def dbs_by_server(topo: Topology) -> dict[int, list[str]]:
    """The databases of each server's logical shards (owned layout: every server's
    data database, shards or not: a move's target needs its tables first)."""
    if topo.owned_db is not None:
        return {sid: [topo.owned_db] for sid in topo.servers}
    return {
        sid: [topo.dbs[s] for s in shards]
        for sid, shards in by_server(topo, range(topo.n_shards), int).items()
    }


def ids_by_server(topo: Topology, ids: Iterable[bytes]) -> dict[int, dict[int, list[bytes]]]:
    """Entity ids grouped by server id, then by logical shard."""
    n_shards, shard_servers = topo.n_shards, topo.shard_servers
    out: dict[int, dict[int, list[bytes]]] = {}
    for key in ids:
        shard = shard_of(key, n_shards)
        out.setdefault(shard_servers[shard], {}).setdefault(shard, []).append(key)
    return out


def scatter(
    server: Callable[[int], Server],
    groups: Mapping[int, G],
    build: Callable[[G], Statement],
    *,
    partial: bool = False,
    commits: bool = False,
    idempotent: bool = True,
) -> Scattered:
    """One batch per server (``build(group)`` on ``server(sid)``), servers in parallel.

    The first error is raised once every batch has finished; with ``partial`` the
    errors are returned by server instead.  ``commits``: a write that commits, not
    retried, whose affected-row counts come back (``Server.run``); ``idempotent``
    False: not retried after an error that may have run it.
    """
    counts: dict[int, list[int]] = {}
    batches: dict[int, Batch] = {}
    for sid, group in groups.items():
        sql, params = build(group)
        if commits:
            counts[sid] = []
            batches[sid] = Batch(server(sid), sql, params, True, False, counts[sid])
        else:
            batches[sid] = Batch(server(sid), sql, params, idempotent=idempotent)
    if partial:
        results, errors = gather_partial(batches)
        return Scattered(results, errors, counts)
    return Scattered(gather(batches), {}, counts)


def bare(sql: str) -> Statement:
    """A statement without parameters (``build`` for groups that are SQL already)."""
    return sql, ()


def joined(statements: Sequence[Statement]) -> Statement:
    """Several statements as one batch: one round trip, their result sets in order."""
    return ";\n".join(sql for sql, _ in statements), [p for _, ps in statements for p in ps]


def rounds(
    server: Callable[[int], Server],
    batches: Mapping[int, Sequence[Statement]],
    before: Callable[[int], None] | None = None,
) -> dict[int, list[Rows]]:
    """Send each server its statements in order, servers in parallel: one scatter per
    position (``before(position)`` first, when given); a server that failed gets no
    more, the first error is raised at the end."""
    out: dict[int, list[Rows]] = {sid: [] for sid, b in batches.items() if b}
    errors: dict[int, SchemalessError] = {}
    for n in range(max((len(b) for b in batches.values()), default=0)):
        if before is not None:
            before(n)
        now = {sid: b[n] for sid, b in batches.items() if n < len(b) and sid not in errors}
        results, failed, _ = scatter(server, now, _same, partial=True)
        errors.update(failed)
        for sid, rows in results.items():
            out[sid].append(rows)
    for error in errors.values():
        raise error
    return out


def _same(statement: Statement) -> Statement:
    return statement


def unreachable_only(errors: Mapping[Any, SchemalessError]) -> None:
    """For partial results: raise any error that is not an unreachable server."""
    for error in errors.values():
        if not isinstance(error, ShardUnavailable):
            raise error


def shard_unions(topo: Topology, part: Callable[[int], str], tail: str = "") -> dict[int, str]:
    """Per server, one ``union_all`` of ``part(shard)`` over its logical shards (servers
    without any are left out); in the owned layout each part must filter its shard
    (``shard_is``), and the batch ends with the ownership check."""
    out: dict[int, str] = {}
    for sid in topo.servers:
        shards = topo.shards_of(sid)
        if shards:
            out[sid] = guarded([union_all([part(s) for s in shards], tail)], topo.owned_db, shards)
    return out


def server_reads(
    topo: Topology,
    whole: Callable[[str, list[int]], str],
    part: Callable[[int], str],
    tail: str = "",
    skip: Collection[int] = (),
) -> dict[int, str]:
    """Per server, one read of its logical shards: in the owned layout one statement,
    ``whole(data database, the server's shards of the map)`` (which filters them with
    ``owned.shards_sql``: never a shard being copied in, nor one left behind), then the
    ownership check; otherwise ``shard_unions(topo, part, tail)``.  ``skip``: shards
    left out (owned layout: those a move may have fenced, whose check would fail)."""
    db = topo.owned_db
    if db is None:
        return shard_unions(topo, part, tail)
    out: dict[int, str] = {}
    for sid in topo.servers:
        shards = [s for s in topo.shards_of(sid) if s not in skip]
        if shards:
            out[sid] = guarded([whole(db, shards)], db, shards)
    return out


def shard_is(topo: Topology, shard: int) -> str:
    """The owned layout's condition that a statement reads one shard's rows, with
    ``AND`` (nothing in the layout of a database per shard)."""
    return f"`shard` = {int(shard)} AND " if topo.owned_db is not None else ""


def added_page_sql(topo: Topology, shard: int, columns: str, limit: int) -> str:
    """``SELECT columns`` of up to ``limit`` entity rows of a shard after an ``added_id``
    (the one parameter), in ``added_id`` order: the per-shard scans' page (the Cleaner,
    the change feed's snapshot, a dump).  Read down the key in that order, named: in
    the owned layout ``by_shard_added`` (``by_updated`` also matches ``shard = s``, and a
    page read by it would sort the shard's rows), else the primary key."""
    key = "PRIMARY" if topo.owned_db is None else "`by_shard_added`"
    return (
        f"SELECT {columns} FROM {quote(topo.dbs[shard], 'entities')} FORCE INDEX ({key})"
        f" WHERE {shard_is(topo, shard)}`added_id` > %s ORDER BY `added_id` LIMIT {int(limit)}"
    )


# -- the packet budget -------------------------------------------------------------------


def sql_bytes(values: Iterable[Any]) -> int:
    """At most the bytes of SQL that a row of these values takes as literals (a
    character is up to 4 bytes, and escaping at most doubles them)."""
    return 64 + sum(
        8 * len(v) if isinstance(v, str) else 2 * len(v) if isinstance(v, bytes) else 32
        for v in values
    )


@functools.lru_cache(maxsize=1024)
def row_bytes(index: Index) -> int:
    """At most the bytes of SQL one row of ``index`` takes, from its column types alone
    (4 per byte of a key: utf8mb4, escaped): for batches sized without reading rows."""
    return 128 + sum(4 * t.key_bytes + 8 for t in index.types)


#: At most the SQL of one entity id in an ``IN (...)`` list (16 bytes, escaped).
ID_BYTES = 2 * 16 + 8


def chunks(items: list[T], size: Callable[[T], int], budget: int) -> Iterator[list[T]]:
    """Consecutive runs of ``items`` whose ``size`` adds up to at most ``budget`` bytes
    (an item above it goes alone): batches that fit the servers' max_allowed_packet."""
    start, total = 0, 0
    for i, item in enumerate(items):
        n = size(item)
        if i > start and total + n > budget:
            yield items[start:i]
            start, total = i, 0
        total += n
    if start < len(items):
        yield items[start:]
