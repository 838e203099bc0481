"""Named consumers of the change feed: positions kept in the catalog, their lag.

``ds.subscribe(name)`` loads the positions a consumer acknowledged (table
``feed_positions``, one row per logical shard); ``ack`` stores new ones, so a restarted
consumer resumes after what it acknowledged.  The Cleaner trims the feed below the
smallest position of every subscription (``acknowledged``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .catalog import now_us
from .errors import InvalidQuery
from .feed import ChangeEvent, ChangeFeed, Position, decode_cursor, head_is, part_shards
from .names import quote
from .owned import guarded
from .scatter import Statement, joined, shard_is

if TYPE_CHECKING:
    from .catalog import Topology
    from .cluster import Cluster
    from .reader import Reader

__all__ = ["Subscription", "acknowledged", "feed_status", "unsubscribe"]

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")


def _table(cluster: Cluster) -> str:
    return quote(cluster.catalog.db, "feed_positions")


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidQuery(
            f"invalid subscription name {name!r}: 1 to 64 letters, digits and '_.:-'"
        )
    return name


def _stored(position: Position) -> tuple[int, int | None]:
    """``(position, scan)`` columns: a snapshot in progress has its ``added_id`` in
    ``scan`` (and P, 0 before it began, in ``position``)."""
    if isinstance(position, tuple):
        return position[0] or 0, position[1]
    return position, None


def _loaded(position: int, scan: int | None) -> Position:
    if scan is None:
        return position
    return (position, scan) if position or scan else (None, 0)


class Subscription:
    """A named consumer of (a part of) the feed.  ``changes`` reads from the last
    acknowledged positions; ``ack(event)`` stores the event's."""

    def __init__(
        self,
        reader: Reader,
        name: str,
        part: tuple[int, int] | None = None,
        snapshot: bool = False,
    ) -> None:
        self.reader = reader
        self.cluster = cluster = reader.cluster
        self.name = _check_name(name)
        self.shards = part_shards(cluster.current().n_shards, part)
        rows = cluster.catalog.server.run(
            f"SELECT `shard`, `position`, `scan` FROM {_table(cluster)} WHERE `name` = %s",
            (self.name,),
        )[0]
        stored = {int(s): _loaded(int(p), None if c is None else int(c)) for s, p, c in rows}
        first: Position = (None, 0) if snapshot else 0
        self.positions: dict[int, Position] = {s: stored.get(s, first) for s in self.shards}
        missing = {s: p for s, p in self.positions.items() if s not in stored}
        if missing:  # registered at once: the Cleaner keeps the feed for it from now on
            self._save(missing)

    def changes(self, follow: bool = False, *, partial: bool = False) -> Iterator[ChangeEvent]:
        """Events after the acknowledged positions (see ``DataStore.changes``; with
        ``partial``, a server that does not answer is left out, its shards' positions
        kept in every event, so acknowledging one never moves them)."""
        return self.feed(partial).events(follow)

    def feed(self, partial: bool = False) -> ChangeFeed:
        """The feed from the acknowledged positions."""
        return ChangeFeed(self.reader, self.positions, self.shards, partial=partial)

    def ack(self, event: ChangeEvent | str) -> None:
        """Store the position after ``event`` (or a cursor) for this subscription's
        logical shards: a restart resumes after it."""
        n_shards = self.cluster.current().n_shards
        if isinstance(event, ChangeEvent):
            positions = event.positions
        else:
            positions = decode_cursor(event, n_shards)
        moved = {
            s: positions.get(s, 0) for s in self.shards if positions.get(s, 0) != self.positions[s]
        }
        if moved:
            self._save(moved)
            self.positions.update(moved)

    def _save(self, positions: dict[int, Position]) -> None:
        rows = [(s, *_stored(p)) for s, p in sorted(positions.items())]
        marks = ", ".join(["(%s, %s, %s, %s, %s)"] * len(rows))
        params: list[Any] = []
        now = now_us()
        for shard, position, scan in rows:
            params += [self.name, shard, position, scan, now]
        self.cluster.catalog.server.run(
            f"INSERT INTO {_table(self.cluster)} (`name`, `shard`, `position`, `scan`, `acked`)"
            f" VALUES {marks} ON DUPLICATE KEY UPDATE `position` = VALUES(`position`),"
            " `scan` = VALUES(`scan`), `acked` = VALUES(`acked`)",
            params,
        )


def _lag_sql(topo: Topology, shard: int, position: int) -> Statement:
    """A logical shard's head, and the time of its first change after ``position``."""
    db = topo.dbs[shard]
    return (
        f"SELECT (SELECT `seq` FROM {quote(db, 'changes_head')} WHERE {head_is(topo, shard)}),"
        f" (SELECT `at` FROM {quote(db, 'changes')} WHERE {shard_is(topo, shard)}`seq` > %s"
        " ORDER BY `seq` LIMIT 1)",
        [position],
    )


def unsubscribe(cluster: Cluster, name: str) -> int:
    """Forget a subscription (the feed is no longer kept for it); how many positions."""
    out = cluster.catalog.server.run(
        f"DELETE FROM {_table(cluster)} WHERE `name` = %s; SELECT ROW_COUNT()",
        (_check_name(name),),
    )
    return int(out[0][0][0])


def acknowledged(cluster: Cluster) -> dict[int, int] | None:
    """Per logical shard, the smallest position of every subscription (what all of
    them acknowledged); None when there is no subscription."""
    rows = cluster.catalog.server.run(
        f"SELECT `shard`, MIN(`position`), COUNT(DISTINCT `name`) FROM {_table(cluster)}"
        " GROUP BY `shard`; "
        f"SELECT COUNT(DISTINCT `name`) FROM {_table(cluster)}"
    )
    subscribers = int(rows[1][0][0])
    if not subscribers:
        return None
    # a shard that some subscription has no row for (another part layout): keep it all
    return {int(s): int(p) if int(n) == subscribers else 0 for s, p, n in rows[0]}


def feed_status(cluster: Cluster, partial: bool = False) -> list[dict[str, Any]]:
    """Each subscription's lag: changes not acknowledged (``behind``), the age of the
    oldest of them and of the last acknowledgement, in seconds.  ``partial``: a server
    that does not answer leaves ``behind`` and ``oldest_s`` of the subscriptions with
    shards on it ``None``, its address in their ``unreachable``; else it raises."""
    topo = cluster.refresh()
    rows = cluster.catalog.server.run(
        f"SELECT `name`, `shard`, `position`, `scan`, `acked` FROM {_table(cluster)}"
        " ORDER BY `name`, `shard`"
    )[0]
    plan: dict[int, list[tuple[str, int, int]]] = {}
    for name, shard, position, _, _ in rows:
        if int(shard) < topo.n_shards:
            sid = topo.shard_servers[int(shard)]
            plan.setdefault(sid, []).append((str(name), int(shard), int(position)))

    def heads(parts: list[tuple[str, int, int]]) -> Statement:
        sql, params = joined([_lag_sql(topo, s, p) for _, s, p in parts])
        return guarded([sql], topo.owned_db, (s for _, s, _ in parts)), params

    scattered = cluster.scatter(topo, plan, heads, partial=partial)
    now = now_us()
    out: dict[str, dict[str, Any]] = {}
    for name, _, _, scan, acked in rows:
        info = out.setdefault(
            str(name),
            {
                "name": str(name),
                "shards": 0,
                "behind": 0,
                "oldest_s": 0.0,
                "acked_s": None,
                "unreachable": [],
            },
        )
        info["shards"] += 1
        info["snapshot"] = info.get("snapshot", False) or scan is not None
        age = (now - int(acked)) / 1e6
        info["acked_s"] = age if info["acked_s"] is None else min(info["acked_s"], age)
    for sid in scattered.errors:
        for name in sorted({name for name, _, _ in plan[sid]}):
            out[name].update(behind=None, oldest_s=None)
            out[name]["unreachable"].append(str(topo.servers[sid]))
    for sid, replies in scattered.results.items():
        for (name, _, position), reply in zip(plan[sid], replies, strict=True):
            info, (head, oldest) = out[name], reply[0]
            if info["behind"] is None:
                continue
            info["behind"] += max(0, int(head or 0) - position)
            if oldest is not None:
                info["oldest_s"] = max(info["oldest_s"], (now - int(oldest)) / 1e6)
    return list(out.values())
