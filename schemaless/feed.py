"""The change feed: events in each logical shard's commit order, cursors, snapshots.

docs/architecture.md ("The change feed") argues the design.  Step 2 appends a row to
the shard's ``changes`` table in its own transaction, numbered from the shard's head row
(``writes.feed_sql``), so on one logical shard sequence order is commit order and the
numbers have no holes: a reader advances to the last row it read.  ``ChangeFeed``
reads every logical shard of its part, round after round (one batch per server,
servers in parallel), optionally after a snapshot of the live entities.
"""

from __future__ import annotations

import base64
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from . import failpoints, owned
from .entity import Entity
from .errors import CatalogError, InvalidCursor, InvalidQuery, SchemalessError
from .names import quote
from .owned import admin, guarded
from .scatter import Statement, added_page_sql, bare, joined, shard_is, unreachable_only
from .schema import changes_tables_sql

if TYPE_CHECKING:
    from .catalog import Topology
    from .cluster import Cluster
    from .reader import Reader

__all__ = [
    "ChangeEvent",
    "ChangeFeed",
    "FeedExpired",
    "Position",
    "decode_cursor",
    "enable_changes",
    "encode_cursor",
    "head_is",
    "open_feed",
    "part_shards",
]

#: A logical shard's place in the feed: the last sequence number delivered, or a
#: snapshot in progress ``(P, added_id)`` (P: the head when it began, None: not yet).
Position = int | tuple[int | None, int]

_CURSOR_TAG = "c1."
_BATCH = 500  # rows per logical shard per round


class FeedExpired(SchemalessError):
    """A cursor or subscription whose changes were trimmed (older than the feed's
    retention): start again, with a snapshot."""


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One change (or, in a snapshot, one live entity): ``entity`` is the body after
    the change, None for a delete; ``cursor`` resumes after this event."""

    id: bytes
    version: int
    entity: Entity | None
    shard: int
    seq: int | None  # None: a snapshot's entity
    at: int  # microseconds: when it was written
    _base: Mapping[int, Position] = field(repr=False)
    _position: Position = field(repr=False)

    @property
    def cursor(self) -> str:
        """Resumes after this event (and after everything before it)."""
        return encode_cursor(self.positions)

    @property
    def positions(self) -> dict[int, Position]:
        """The feed position after this event, per logical shard."""
        return {**self._base, self.shard: self._position}

    @property
    def deleted(self) -> bool:
        """True for a delete."""
        return self.entity is None


def encode_cursor(positions: Mapping[int, Position]) -> str:
    """An opaque cursor string (shards at position 0 are left out: from the oldest)."""
    packed = {s: list(p) if isinstance(p, tuple) else p for s, p in positions.items() if p != 0}
    raw = zlib.compress(msgpack.packb(packed, use_bin_type=True))
    return _CURSOR_TAG + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: object, n_shards: int) -> dict[int, Position]:
    """The positions of a cursor, each field checked; ``InvalidCursor`` (an
    ``InvalidQuery``) if malformed."""
    if not isinstance(cursor, str) or not cursor.startswith(_CURSOR_TAG):
        raise InvalidCursor(f"not a change feed cursor: {str(cursor)[:40]!r}")
    try:
        text = cursor[len(_CURSOR_TAG) :]
        raw = zlib.decompress(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        packed = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, zlib.error, msgpack.UnpackException) as exc:
        raise InvalidCursor(f"not a change feed cursor: {cursor[:40]!r}") from exc
    if not isinstance(packed, dict):
        raise InvalidCursor("not a change feed cursor: not a map")
    out: dict[int, Position] = {}
    for shard, pos in packed.items():
        if not _count(shard) or shard >= n_shards:
            raise InvalidCursor(f"change feed cursor names shard {shard!r} of {n_shards}")
        if _count(pos):
            out[shard] = pos
        elif (
            isinstance(pos, list)
            and len(pos) == 2
            and (pos[0] is None or _count(pos[0]))
            and _count(pos[1])
        ):
            out[shard] = (pos[0], pos[1])
        else:
            raise InvalidCursor(f"change feed cursor: bad position {pos!r} of shard {shard}")
    return out


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**64


def part_shards(n_shards: int, part: tuple[int, int] | None) -> list[int]:
    """The logical shards of part ``(k, n)`` (``shard % n == k``, as the Cleaner's)."""
    if part is None:
        return list(range(n_shards))
    k, n = part
    if not (_count(k) and _count(n) and k < n):
        raise InvalidQuery(f"part must be (k, n) with 0 <= k < n, got {part!r}")
    return [s for s in range(n_shards) if s % n == k]


def open_feed(
    reader: Reader,
    cursor: str | None = None,
    *,
    snapshot: bool = False,
    part: tuple[int, int] | None = None,
    partial: bool = False,
) -> ChangeFeed:
    """The feed ``DataStore.changes`` reads: after ``cursor``, else from the oldest
    change kept (with ``snapshot``, every live entity first); ``partial``: the servers
    that answer (``ChangeFeed.unreachable``)."""
    n_shards = reader.cluster.current().n_shards
    shards = part_shards(n_shards, part)
    if cursor is not None:
        positions: dict[int, Position] = dict(decode_cursor(cursor, n_shards))
    else:
        positions = {s: (None, 0) for s in shards} if snapshot else {}
    return ChangeFeed(reader, positions, shards, partial=partial)


def enable_changes(cluster: Cluster) -> None:
    """Turn the change feed on: the tables on every logical shard, then the catalog's
    switch with the next index epoch (as an index declaration: a write of a body from a
    map without the feed meets a dropped fence, refreshes and writes again, with its
    change row), then the old fences dropped (each waits for the writes that named it)."""
    if cluster.refresh().changes:
        return
    busy = "another client is declaring an index or turning the change feed on"
    with cluster.catalog.lock("declare", busy, wait=20):
        for _ in range(5):
            topo = cluster.refresh()
            if topo.changes:
                return
            if topo.moves:
                raise CatalogError("cannot turn the change feed on while a shard move is recorded")
            cluster.scatter(topo, _changes_tables(topo), lambda sql: bare(admin(sql)))
            cluster.create_fences(topo, topo.index_epoch + 1)
            if cluster.catalog.enable_changes(topo.index_epoch):
                cluster.retire_fences(cluster.refresh())
                return
        raise CatalogError("the index epoch kept moving; try turning the change feed on again")


def _changes_tables(topo: Topology) -> dict[int, list[str]]:
    """Each server's DDL of the feed's tables (owned layout: on every server, with a
    head row for each logical shard it holds: its ``owned`` rows, never the map's, so a
    shard whose move fenced it meanwhile is not made owned again)."""
    db = topo.owned_db
    if db is not None:
        heads = (
            f"INSERT IGNORE INTO {quote(db, 'changes_head')} (`shard`, `seq`)"
            f" SELECT `shard`, 0 FROM {quote(db, 'owned')}"
        )
        return {sid: [*owned.changes_tables_sql(db), heads] for sid in topo.servers}
    by_server: dict[int, list[str]] = {}
    for shard, sid in enumerate(topo.shard_servers):
        by_server.setdefault(sid, []).extend(changes_tables_sql(topo.dbs[shard]))
    return by_server


def head_is(topo: Topology, shard: int) -> str:
    """The condition naming a logical shard's ``changes_head`` row (the owned layout
    has a row per shard in one table, the other layout one row per shard's database)."""
    return f"`shard` = {int(shard)}" if topo.owned_db is not None else "`one` = 1"


def _heads_sql(topo: Topology, shards: list[int]) -> str:
    """The heads of some logical shards of one server (owned layout), one statement."""
    listed = ", ".join(str(int(s)) for s in shards)
    return (
        f"SELECT `shard`, `seq` FROM {quote(str(topo.owned_db), 'changes_head')}"
        f" WHERE `shard` IN ({listed})"
    )


class ChangeFeed:
    """Reads the feed of some logical shards from given positions (see ``changes``)."""

    def __init__(
        self,
        reader: Reader,
        positions: Mapping[int, Position],
        shards: Sequence[int],
        *,
        batch: int = _BATCH,
        poll: float = 0.2,
        partial: bool = False,
    ) -> None:
        self.reader = reader
        self.cluster = reader.cluster
        self.shards = list(shards)
        self.positions: dict[int, Position] = {s: positions.get(s, 0) for s in self.shards}
        self.batch = batch
        self.poll = poll
        self.partial = partial
        #: ``partial``: the shards that wait for a server that has not answered since it
        #: failed, by its address (their positions kept: a later round, or the cursor,
        #: resumes them)
        self.unreachable: dict[str, list[int]] = {}
        self._down: set[int] = set()  # those servers' ids
        self._changed: set[bytes] = set()  # the scanning shard's ids changed since its P
        self._changed_shard: int | None = None  # that shard
        # Owned layout: shards read up to their head, whose changes are read again only
        # once a round's one statement of heads shows them moving (an idle shard costs a
        # row, not two statements, per round).
        self._quiet: set[int] = set()
        self._changed_upto = 0

    def events(
        self, follow: bool = False, after_round: Callable[[ChangeFeed], None] | None = None
    ) -> Iterator[ChangeEvent]:
        """Every event from the positions on; without ``follow``, until caught up.
        ``after_round``: called with the feed after each round (``unreachable``)."""
        self.check_on()
        while True:
            events, more = self.next_round()
            if after_round is not None:
                after_round(self)
            yield from events
            if not more and not events:
                if not follow:
                    return
                time.sleep(self.poll)

    def check_on(self) -> None:
        """``CatalogError`` unless the datastore's change feed is on."""
        if not self.cluster.topology.changes and not self.cluster.refresh().changes:
            raise CatalogError(
                "the change feed is off: open the datastore with changes=True"
                " (CLI: `schemaless init --changes`)"
            )

    def next_round(self) -> tuple[list[ChangeEvent], bool]:
        """One round within a call's deadline: the events, and whether a shard has
        more to read at once (none and False: caught up)."""
        found = self.reader.calls.call(self._round)
        failpoints.hit("feed.after_round")
        return found

    # -- one round ----------------------------------------------------------------------

    def _round(self) -> tuple[list[ChangeEvent], bool]:
        """One batch per server; the events in shard order, and whether a shard has
        more to read at once."""
        topo = self.cluster.current()
        if topo.owned_db is None:
            self._quiet.clear()  # a head is read with its shard's changes
        scanning = self._scanning(topo)
        quiet: dict[int, list[int]] = {}
        plan: dict[int, list[tuple[int, str, list[Any]]]] = {}
        for shard in self.shards:
            pos = self.positions[shard]
            sid = topo.shard_servers[shard]
            if isinstance(pos, tuple) and shard != scanning:
                continue  # snapshots run one logical shard at a time
            if shard in self._quiet:
                quiet.setdefault(sid, []).append(shard)
                continue
            sql, params = self._sql(topo, shard, pos)
            plan.setdefault(sid, []).append((shard, sql, params))
        groups = {sid: (quiet.get(sid, []), plan.get(sid, [])) for sid in quiet.keys() | plan}

        def batch(group: tuple[list[int], list[tuple[int, str, list[Any]]]]) -> Statement:
            idle, parts = group
            reads: list[Statement] = [(_heads_sql(topo, idle), [])] if idle else []
            sql, params = joined(reads + [(sql, params) for _, sql, params in parts])
            return guarded([sql], topo.owned_db, [*idle, *(s for s, _, _ in parts)]), params

        replies = self._read(topo, groups, batch)
        base = dict(self.positions)
        events: list[ChangeEvent] = []
        more = scanning is not None and (
            topo.shard_servers[scanning] in replies or self._scanning(topo) != scanning
        )
        for sid, (idle, parts) in sorted(groups.items()):
            if sid not in replies:
                continue  # partial: its shards stay where they were
            sets = list(replies[sid])
            if idle:
                more = self._woken(idle, sets.pop(0)) or more
            for shard, _, _ in parts:
                pos = self.positions[shard]
                n = 2 if not isinstance(pos, tuple) or pos[0] is not None else 1
                got, sets = sets[:n], sets[n:]
                found, full = self._apply(shard, pos, got, base)
                events += found
                more = more or full
                if self.positions[shard] != pos:  # later events' cursors include it
                    base = {**base, shard: self.positions[shard]}
        return events, more

    def _read(
        self,
        topo: Topology,
        groups: dict[int, tuple[list[int], list[tuple[int, str, list[Any]]]]],
        batch: Callable[[tuple[list[int], list[tuple[int, str, list[Any]]]]], Statement],
    ) -> Mapping[int, Any]:
        """The round's result sets by server; ``partial``: of those that answered, the
        others' shards in ``unreachable``."""
        scattered = self.cluster.scatter(topo, groups, batch, partial=self.partial)
        unreachable_only(scattered.errors)
        self._down = (self._down - scattered.results.keys()) | scattered.errors.keys()
        self.unreachable = {
            str(topo.servers[sid]): [s for s in self.shards if topo.shard_servers[s] == sid]
            for sid in sorted(self._down)
        }
        return scattered.results

    def _scanning(self, topo: Topology) -> int | None:
        """The logical shard whose snapshot this round reads (one at a time): the first
        of a server not down (``partial``), else the first."""
        pending = [s for s in self.shards if isinstance(self.positions[s], tuple)]
        up = [s for s in pending if topo.shard_servers[s] not in self._down]
        return (up or pending)[0] if pending else None

    def _woken(self, idle: list[int], heads: Any) -> bool:
        """Whether a quiet shard's head moved from its position (or is missing): it is
        read in full again."""
        found = {int(s): int(seq) for s, seq in heads}
        woken = {s for s in idle if found.get(s) != self.positions[s]}
        self._quiet -= woken
        return bool(woken)

    def _sql(self, topo: Topology, shard: int, pos: Position) -> tuple[str, list[Any]]:
        """One logical shard's reads: its head and the changes after ``pos``; or a
        snapshot's head; or a snapshot's page and the ids changed since its head."""
        db, at = topo.dbs[shard], shard_is(topo, shard)
        changes = quote(db, "changes")
        head = f"SELECT `seq` FROM {quote(db, 'changes_head')} WHERE {head_is(topo, shard)}"
        if isinstance(pos, int):
            return (
                f"{head}; SELECT `seq`, `id`, `version`, `body`, `at` FROM {changes}"
                f" WHERE {at}`seq` > %s ORDER BY `seq` LIMIT {int(self.batch)}",
                [pos],
            )
        if pos[0] is None:  # a snapshot begins: the head first
            return head, []
        return (
            added_page_sql(
                topo, shard, "`added_id`, `id`, `version`, `body`, `updated`", self.batch
            )
            + f"; SELECT `seq`, `id` FROM {changes} WHERE {at}`seq` > %s ORDER BY `seq`",
            [pos[1], max(pos[0], self._changed_upto if self._changed_shard == shard else 0)],
        )

    def _apply(
        self, shard: int, pos: Position, sets: list[Any], base: dict[int, Position]
    ) -> tuple[list[ChangeEvent], bool]:
        """The events of one shard's reply, its position moved on; and whether the
        shard returned a full batch."""
        if isinstance(pos, int):
            return self._follow(shard, pos, sets[0], sets[1], base)
        if pos[0] is None:
            start = int(sets[0][0][0])
            self.positions[shard] = (start, 0)
            self._changed, self._changed_upto, self._changed_shard = set(), start, shard
            return [], True
        return self._scan(shard, (pos[0], pos[1]), sets[0], sets[1], base)

    def _follow(
        self, shard: int, pos: int, head: Any, rows: Any, base: dict[int, Position]
    ) -> tuple[list[ChangeEvent], bool]:
        top = int(head[0][0]) if head else 0
        first = int(rows[0][0]) if rows else None
        if pos and (first != pos + 1 if rows else top > pos):
            raise FeedExpired(
                f"logical shard {shard}: changes after {pos} were trimmed (the oldest is "
                f"{first if first is not None else 'gone'}); start again with a snapshot"
            )
        decode = self.reader.decode
        events = []
        expected = first
        for seq, key, version, body, at in rows:
            key, seq = bytes(key), int(seq)
            if seq != expected:  # numbers have no holes but a trimmed prefix: never skip one
                raise FeedExpired(
                    f"logical shard {shard}: changes {expected} to {seq - 1} are missing"
                    " from the feed; start again with a snapshot"
                )
            expected = seq + 1
            entity = None if body is None else decode(key, shard, int(version), bytes(body))
            events.append(ChangeEvent(key, int(version), entity, shard, seq, int(at), base, seq))
        if rows:
            self.positions[shard] = int(rows[-1][0])
        if self.positions[shard] == top:
            self._quiet.add(shard)
        return events, len(rows) >= self.batch

    def _scan(
        self,
        shard: int,
        pos: tuple[int, int],
        page: Any,
        changed: Any,
        base: dict[int, Position],
    ) -> tuple[list[ChangeEvent], bool]:
        """A page of the snapshot: live entities without a change after P (those come
        with the changes that follow)."""
        start, _ = pos
        if self._changed_shard != shard or self._changed_upto < start:
            # resumed from a cursor, or back from another shard's scan: collect from P
            self._changed, self._changed_upto, self._changed_shard = set(), start, shard
        if changed:
            if int(changed[0][0]) != self._changed_upto + 1:
                raise FeedExpired(
                    f"logical shard {shard}: changes after {self._changed_upto} were trimmed"
                    " during its snapshot; start again"
                )
            self._changed.update(bytes(r[1]) for r in changed)
            self._changed_upto = int(changed[-1][0])
        events = []
        for added, key, version, body, updated in page:
            key = bytes(key)
            if body is None or key in self._changed:
                continue
            entity = self.reader.decode(key, shard, int(version), bytes(body))
            events.append(
                ChangeEvent(
                    key, int(version), entity, shard, None, int(updated), base, (start, added)
                )
            )
        if len(page) < self.batch:
            self.positions[shard] = start  # the snapshot is done: the changes since P
            self._changed, self._changed_upto = set(), 0
        else:
            self.positions[shard] = (start, int(page[-1][0]))
        return events, True
