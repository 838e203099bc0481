"""Timelines over a datastore: follow, post, home pages (Oku's push and pull, merged).

``Feeds(ds, "home", pull_threshold=1000)``.  The follow graph is ``Edges`` (type
``<name>_follows``, inverse ``<name>_followers``).  A post is an entity stored with
its ``author`` and ``feed`` and indexed in its author's ``posts`` rows (author's
shard).  A worker (``work``; ``schemaless feeds work``) consumes the change feed under
the subscription ``feeds_<name>`` and fans each post out into narrow ``inbox`` rows
(reader, time, post, author: no body) on each follower's shard; an author with more
than ``pull_threshold`` followers is *pulled* instead: one row on every server's
``pulled`` list, and ``home`` reads such followees' ``posts`` rows at read time.
Inbox rows are keyed by (reader, time, post) with the post's first time (its posts
row's), so a post fanned out again after a crash, or updated, is never doubled.
``home`` joins the inbox with the reader's follow edges, so after ``unfollow`` nothing
of the followee shows, whatever a fan-out in flight still writes; deleted and expired
posts are dropped when the page is hydrated.  docs/feeds.md.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .catalogdb import now_us
from .edges import (
    Edges,
    NotCreated,
    check_limit,
    create_tables,
    missing_tables,
    pack_cursor,
    unpack_cursor,
)
from .edgetables import check_type, table_names
from .edgetables import tables_sql as edge_tables_sql
from .entity import Entity
from .errors import (
    InvalidCursor,
    InvalidQuery,
    PermissionDenied,
    SchemalessError,
    ShardUnavailable,
    TransientError,
)
from .feed import ChangeEvent, ChangeFeed, Position, enable_changes, encode_cursor
from .ids import to_id
from .names import quote
from .owned import (
    GUARD_KEY,
    admin,
    guard_sql,
    guarded,
    in_guarded_transaction,
)
from .query import Page
from .scatter import Statement, by_server, unreachable_only

if TYPE_CHECKING:
    from .catalog import Topology
    from .store import DataStore

__all__ = ["Feeds", "WorkRound"]

_CURSOR = "fc1."
_FAN = 5000  # followers read, and inbox rows written, per round trip
_TRIM = 100  # readers trimmed per transaction
_OWED = 100_000  # posts and inbox rows owed, above which the worker reads no new changes
_Row = tuple[int, bytes, bytes]  # (at, post, author)
_InboxRow = tuple[int, bytes, _Row]  # (reader's shard, reader, row)
_Failed = SchemalessError | None  # why a server did not answer (None: every one did)
#: A page's rows: (node, n, after, partial) -> (rows, logical shards that did not answer)
_Rows = Callable[[bytes, int, "tuple[int, bytes] | None", bool], "tuple[list[_Row], set[int]]"]
#: The inbox's pages are compressed: a reader's rows repeat their shard, reader and
#: the authors they follow, and ids of one time share prefixes (59-80 bytes a row
#: instead of 174; docs/feeds.md, "The inbox row's floor").  The posts table's too
#: (a quarter of the pages); not the follow graph's, whose adds it would slow.
INBOX_COMPRESSED = "ROW_FORMAT=COMPRESSED KEY_BLOCK_SIZE=8"


def tables_sql(db: str, name: str) -> list[str]:
    """A feed's inbox and posts tables (guarded) and its server-wide pulled list.  An
    inbox is clustered in reading order (a page is one range, no lookups), its only
    key: a post's time is its first version's (the posts row's, ``once`` a post), so a
    fan-out done again, or of a later version, writes the same rows, which are kept."""
    inbox, posts, pulled = _tables(name)
    return [
        f"CREATE TABLE IF NOT EXISTS {quote(db, inbox)} ("
        " `shard` SMALLINT UNSIGNED NOT NULL, `user` BINARY(16) NOT NULL,"
        " `at` BIGINT UNSIGNED NOT NULL, `post` BINARY(16) NOT NULL,"
        " `author` BINARY(16) NOT NULL,"
        f" PRIMARY KEY (`shard`, `user`, `at`, `post`), {GUARD_KEY}"
        f") ENGINE=InnoDB {INBOX_COMPRESSED}",
        f"CREATE TABLE IF NOT EXISTS {quote(db, posts)} ("
        " `shard` SMALLINT UNSIGNED NOT NULL, `author` BINARY(16) NOT NULL,"
        " `at` BIGINT UNSIGNED NOT NULL, `post` BINARY(16) NOT NULL,"
        " PRIMARY KEY (`shard`, `author`, `at`, `post`),"
        f" UNIQUE KEY `once` (`shard`, `author`, `post`), {GUARD_KEY})"
        f" ENGINE=InnoDB {INBOX_COMPRESSED}",
        f"CREATE TABLE IF NOT EXISTS {quote(db, pulled)} ("
        " `author` BINARY(16) NOT NULL PRIMARY KEY, `since` BIGINT UNSIGNED NOT NULL"
        ") ENGINE=InnoDB",
        *guard_sql(db, inbox),
        *guard_sql(db, posts),
    ]


def _tables(name: str) -> tuple[str, str, str]:
    return f"feed__{name}__inbox", f"feed__{name}__posts", f"feed__{name}__pulled"


def _keyset(alias: str, after: bool) -> str:
    a = alias
    return f" AND ({a}`at` < %s OR ({a}`at` = %s AND {a}`post` < %s))" if after else ""


class Feeds:
    """Home timelines of one feed ``name`` over a datastore (module docstring).

    ``pull_threshold``: authors with more followers are pulled at read time (the
    worker's decision, sticky).  ``backfill``: how many of a followee's newest posts
    ``follow`` copies into the follower's timeline.  ``create``: the change feed (the
    worker reads it) is turned on if it is off and the tables a server lacks are
    created; that needs the admin's rights, so for the application's user an admin
    runs ``schemaless feeds create NAME`` first (else ``NotCreated`` names it).
    """

    def __init__(
        self,
        ds: DataStore,
        name: str = "home",
        *,
        pull_threshold: int = 1000,
        backfill: int = 200,
        timeout: float | None = None,
        create: bool = True,
    ) -> None:
        _check_name(name)
        for value, what in ((pull_threshold, "pull_threshold"), (backfill, "backfill")):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidQuery(f"{what} must be an int >= 0, got {value!r}")
        self.ds, self.name, self.timeout = ds, name, timeout
        self.pull_threshold, self.backfill = pull_threshold, backfill
        self.graph = Edges(
            ds, f"{name}_follows", inverse=f"{name}_followers", timeout=timeout, create=False
        )
        self.subscription = f"feeds_{name}"
        self.inbox, self.posts_table, self.pulled = _tables(name)
        self._pulled: set[bytes] = set()  # authors known to be pulled (the worker's)
        if create and (not ds.cluster.refresh().changes or not self.exists()):
            self.create()

    def exists(self) -> bool:
        """Whether the feed's tables and its follow graph's are on every server that
        answers (one statement each; a server that is down is not waited for again)."""
        tables = [t for k in self.graph.kinds() for t in table_names(k)] + list(_tables(self.name))
        return not missing_tables(self.ds, tables)

    def create(self) -> None:
        """Turn the change feed on and create the feed's tables and its follow graph's
        on every server (idempotent); ``NotCreated`` for a user without the right to."""
        command = f"schemaless feeds create {self.name}"
        try:
            enable_changes(self.ds.cluster)
        except PermissionDenied as exc:
            raise NotCreated(
                f"feed {self.name!r} needs the change feed, which is off, and this user may"
                f" not turn it on: run `{command}` once as the datastore's admin ({exc})"
            ) from exc
        kinds = self.graph.kinds()
        create_tables(
            self.ds,
            lambda db: [
                *(s for k in kinds for s in edge_tables_sql(db, k)),
                *tables_sql(db, self.name),
            ],
            f"feed {self.name!r}",
            command,
        )

    # -- the graph ----------------------------------------------------------------------

    def follow(self, user: Any, author: Any) -> bool:
        """``user`` follows ``author`` (whether new); the author's newest posts are
        copied into the user's timeline.  Following oneself is refused: one's own
        posts are always in one's home."""
        user, author = self._pair(user, author)
        new = self.graph.add(user, author)
        rows = self._posts_rows(author, self.backfill, None, False)[0] if self.backfill else []
        if rows:
            shard = self.ds.cluster.shard_of_id(user)
            _, error = self._insert_inbox([(shard, user, r) for r in rows])
            if error is not None:
                raise error
        return new

    def unfollow(self, user: Any, author: Any) -> bool:
        """``user`` no longer follows ``author`` (whether it did): the edge goes, and
        the author's posts with it from the user's timeline."""
        user, author = self._pair(user, author)
        gone = self.graph.remove(user, author)

        def run(topo: Topology, shard: int) -> None:
            sql = in_guarded_transaction(
                [
                    f"DELETE FROM {self._q(topo, self.inbox)} WHERE `shard` = {int(shard)}"
                    " AND `user` = %s AND `author` = %s"
                ],
                topo.owned_db,
                (shard,),
            )
            self._server(topo, shard).run(sql, (user, author), commits=True)

        self._on(user, run)
        return gone

    def _pair(self, user: Any, author: Any) -> tuple[bytes, bytes]:
        user, author = to_id(user), to_id(author)
        if user == author:
            raise InvalidQuery("a user cannot follow themselves (own posts are always at home)")
        return user, author

    # -- posts --------------------------------------------------------------------------

    def post(self, author: Any, entity: Mapping[str, Any]) -> int:
        """Store ``entity`` as a post of ``author`` (its ``author`` and ``feed`` set;
        an ``id`` given is kept, else a new one is written into the dict); its version.
        Followers see it once the worker has fanned it out (``settle``)."""
        author = to_id(author)
        if not isinstance(entity, Mapping):
            raise InvalidQuery(f"a post is a mapping, got {type(entity).__name__}")
        body = {**entity, "author": author, "feed": self.name}
        version = self.ds.put(body, timeout=self.timeout)
        if isinstance(entity, dict):
            entity.setdefault("id", body["id"])
        self._write_posts([(author, version, to_id(body["id"]))])
        return version

    def home(
        self, user: Any, limit: int = 20, cursor: str | None = None, *, partial: bool = False
    ) -> Page:
        """The newest posts of ``user`` and of everyone ``user`` follows (hydrated
        entities, newest first) and the next page's cursor.  ``partial``: posts stored
        on a server that does not answer are left out, their logical shards in
        ``Page.missing_shards``, instead of an error (the user's own server must
        answer)."""
        user = to_id(user)
        return self._hydrated(user, "home", limit, cursor, self._home_rows, partial)

    def posts(
        self, author: Any, limit: int = 20, cursor: str | None = None, *, partial: bool = False
    ) -> Page:
        """The newest posts of ``author`` and the next page's cursor (``partial`` as
        for ``home``)."""
        author = to_id(author)
        return self._hydrated(author, "posts", limit, cursor, self._posts_rows, partial)

    def _hydrated(
        self, node: bytes, kind: str, limit: int, cursor: str | None, rows: _Rows, partial: bool
    ) -> Page:
        """Pages of rows hydrated until ``limit`` live posts (a deleted or expired
        one is skipped, and with ``partial`` one whose server did not answer); the
        cursor after the last row taken."""
        check_limit(limit)
        after = None if cursor is None else _decode_cursor(cursor, self.name, kind, node)
        out: list[Entity] = []
        missing: set[int] = set()
        while True:
            want = limit - len(out)
            got, gone = rows(node, want + 1, after, partial)
            ids = {post for _, post, _ in got[:want]}
            fetch = functools.partial(self.ds.reader.fetch, ids, partial=partial)
            found, unread = self.ds.calls.call(fetch, self.timeout)
            missing |= gone | unread
            for at, post, author in got[:want]:
                after = (at, post)
                entity = found.get(post)
                if entity is not None and entity.get("author") == author:
                    out.append(entity)
            if len(got) <= want:
                return Page(out, None, tuple(sorted(missing)))
            if len(out) == limit:
                assert after is not None
                return Page(out, _cursor(self.name, kind, node, after), tuple(sorted(missing)))

    def _home_rows(
        self, user: bytes, n: int, after: tuple[int, bytes] | None, partial: bool
    ) -> tuple[list[_Row], set[int]]:
        """The newest ``n`` (at, post, author) of the user's home: the inbox rows of
        authors still followed, the user's own posts, and the pulled followees' posts,
        merged.  One statement on the user's server (and its check), then one per
        server holding pulled followees."""
        keys = () if after is None else (after[0], after[0], after[1])

        def run(topo: Topology, shard: int) -> list[Sequence[Any]]:
            assert topo.owned_db is not None
            sql = _home_sql(topo.owned_db, self.name, self.graph.kind, shard, n, bool(keys))
            return list(self._server(topo, shard).run(sql, (user, *keys, user, *keys, user))[0])

        got = self._on(user, run)
        rows = [_row(r) for r in got if not r[0]]
        pulled_authors = [bytes(r[3]) for r in got if r[0]]
        if not pulled_authors:
            return _newest(rows, n), set()
        pulled, missing = self._pulled_rows(pulled_authors, n, keys, partial)
        return _newest(rows + pulled, n), missing

    def _posts_rows(
        self, author: bytes, n: int, after: tuple[int, bytes] | None, partial: bool
    ) -> tuple[list[_Row], set[int]]:
        keys = () if after is None else (after[0], *after)
        return self._pulled_rows([author], n, keys, partial)

    def _pulled_rows(
        self, authors: list[bytes], n: int, keys: tuple[Any, ...], partial: bool
    ) -> tuple[list[_Row], set[int]]:
        """The newest ``n`` posts rows of some authors: one statement per server,
        merged there; with ``partial``, the logical shards of the authors whose server
        did not answer instead of an error."""

        def run() -> tuple[list[_Row], set[int]]:
            topo = self.ds.cluster.current()
            assert topo.owned_db is not None
            db, of = topo.owned_db, self.ds.cluster.shard_of_id
            shard = {a: of(a) for a in authors}  # each hashed once

            def build(group: list[bytes]) -> Statement:
                parts = " UNION ALL ".join(
                    _posts_sql(db, self.name, shard[a], bool(keys), n) for a in group
                )
                merged = f"SELECT * FROM ({parts}) u ORDER BY `at` DESC, `post` DESC LIMIT {int(n)}"
                sql = guarded([merged], db, {shard[a] for a in group})
                return sql, [v for a in group for v in (a, *keys)]

            groups = by_server(topo, authors, shard.__getitem__)
            results = self.ds.cluster.scatter(topo, groups, build, partial=partial)
            unreachable_only(results.errors)
            rows = [_row(r) for sets in results.results.values() for r in sets[0]]
            return rows, {shard[a] for sid in results.errors for a in groups[sid]}

        rows, missing = self.ds.calls.call(run, self.timeout)
        return _newest(rows, n), missing

    def _write_posts(
        self, posts: list[tuple[bytes, int, bytes]]
    ) -> tuple[dict[bytes, int], _Failed]:
        """The posts rows ``(author, at, post)``, one transaction per server (a post
        present keeps its row); each post's time as stored: its first version's, so
        the inbox rows of a fan-out done again (or of a later version) are the same.
        A post whose author's server did not answer is left out (and why, returned)."""

        def run() -> tuple[dict[bytes, int], _Failed]:
            topo = self.ds.cluster.current()
            table = self._q(topo, self.posts_table)
            shard = self.ds.cluster.shard_of_id

            def build(group: list[tuple[bytes, int, bytes]]) -> Statement:
                values = ", ".join(f"({shard(a)}, %s, %s, %s)" for a, _, _ in group)
                shards = sorted({shard(a) for a, _, _ in group})
                sql = in_guarded_transaction(
                    [
                        f"INSERT INTO {table} (`shard`, `author`, `at`, `post`)"
                        f" VALUES {values} ON DUPLICATE KEY UPDATE `at` = `at`",
                        f"SELECT `post`, `at` FROM {table} WHERE `shard` IN"
                        f" ({', '.join(map(str, shards))}) AND (`author`, `post`) IN"
                        f" ({', '.join(['(%s, %s)'] * len(group))})",
                    ],
                    topo.owned_db,
                    shards,
                )
                return sql, [v for p in group for v in p] + [v for a, _, p in group for v in (a, p)]

            groups = by_server(topo, posts, lambda p: shard(p[0]))
            found = self.ds.cluster.scatter(topo, groups, build, partial=True)
            stored = {bytes(p): int(at) for sets in found.results.values() for p, at in sets[0]}
            return stored, _unreachable(found.errors)

        return self.ds.calls.call(run, self.timeout)

    def _insert_inbox(self, rows: list[_InboxRow]) -> tuple[list[_InboxRow], _Failed]:
        """Inbox rows, in rounds of up to ``_FAN`` rows a server, one transaction per
        server (a row present: kept), in the key's order, so each reader's rows are
        appended, not wedged between the authors' (fuller pages); those of servers that
        did not answer, and why."""
        rows = sorted(rows)
        step = _FAN * len(self.ds.cluster.current().servers)
        left: list[_InboxRow] = []
        error: _Failed = None
        for start in range(0, len(rows), step):
            part = rows[start : start + step]
            failed, why = self.ds.calls.call(
                functools.partial(self._inbox_batch, part), self.timeout
            )
            left, error = left + failed, error or why
        return left, error

    def _inbox_batch(self, part: list[_InboxRow]) -> tuple[list[_InboxRow], _Failed]:
        topo = self.ds.cluster.current()
        table = self._q(topo, self.inbox)

        def build(group: list[_InboxRow]) -> Statement:
            values = ", ".join(f"({s}, %s, %s, %s, %s)" for s, _, _ in group)
            sql = in_guarded_transaction(
                [
                    f"INSERT INTO {table} (`shard`, `user`, `at`, `post`, `author`)"
                    f" VALUES {values} ON DUPLICATE KEY UPDATE `at` = `at`"
                ],
                topo.owned_db,
                [s for s, _, _ in group],
            )
            return sql, [v for _, u, (at, post, author) in group for v in (u, at, post, author)]

        groups = by_server(topo, part, lambda p: p[0])
        errors = self.ds.cluster.scatter(topo, groups, build, partial=True).errors
        return [row for sid in errors for row in groups[sid]], _unreachable(errors)

    # -- trimming -----------------------------------------------------------------------

    def trim(self, keep: int = 1000) -> int:
        """Keep each reader's newest ``keep`` inbox rows and delete the older ones, one
        logical shard after another; how many rows were deleted.  A maintenance pass
        (``schemaless feeds trim``): a page older than the kept rows then shows only
        the reader's own posts and the pulled authors' (never in an inbox).  A server
        that does not answer: the other shards are trimmed, then ``ShardUnavailable``
        says how many rows went and which shards are left (trim again later)."""
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise InvalidQuery(f"keep must be an int >= 1, got {keep!r}")
        deleted, left = 0, []
        for shard in range(len(self.ds.cluster.current().shard_servers)):
            try:
                deleted += self._trim_shard(shard, keep)
            except TransientError as exc:
                left.append((shard, exc))
        if left:
            shards = ", ".join(str(s) for s, _ in left)
            raise ShardUnavailable(
                f"{deleted} inbox rows deleted on the shards that answered; logical shards"
                f" {shards} not trimmed ({left[0][1]}): trim again once they answer"
            )
        return deleted

    def _trim_shard(self, shard: int, keep: int) -> int:
        """Trim the readers of one logical shard with more than ``keep`` rows, up to
        ``_TRIM`` readers a transaction: each one's ``keep``-th newest row found and
        what is older deleted, under the ownership check."""

        def over(topo: Topology, s: int) -> list[bytes]:
            select = (
                f"SELECT `user` FROM {self._q(topo, self.inbox)} WHERE `shard` = {int(s)}"
                f" GROUP BY `user` HAVING COUNT(*) > {int(keep)}"
            )
            rows = self._server(topo, s).run(guarded([select], topo.owned_db, (s,)))[0]
            return [bytes(r[0]) for r in rows]

        def cut(users: list[bytes], topo: Topology, s: int) -> int:
            inbox, reader = self._q(topo, self.inbox), f"`shard` = {int(s)} AND `user` = %s"
            stmts = ["SET @schemaless_trimmed = 0"]
            for _ in users:
                stmts += [
                    "SET @schemaless_at = NULL, @schemaless_post = NULL",
                    f"SELECT `at`, `post` INTO @schemaless_at, @schemaless_post FROM {inbox}"
                    f" WHERE {reader} ORDER BY `at` DESC, `post` DESC LIMIT {int(keep) - 1}, 1",
                    f"DELETE FROM {inbox} WHERE {reader} AND (`at` < @schemaless_at"
                    " OR (`at` = @schemaless_at AND `post` < @schemaless_post))",
                    "SET @schemaless_trimmed = @schemaless_trimmed + ROW_COUNT()",
                ]
            sql = in_guarded_transaction(
                [*stmts, "SELECT @schemaless_trimmed"], topo.owned_db, (s,)
            )
            params = [u for u in users for _ in range(2)]
            sets = self._server(topo, s).run(sql, params, commits=True, idempotent=True)
            return int(sets[0][0][0])

        deleted = 0
        readers = self._on_shard(shard, over)
        for start in range(0, len(readers), _TRIM):
            chunk = readers[start : start + _TRIM]
            deleted += self._on_shard(shard, functools.partial(cut, chunk))
        return deleted

    # -- the fan-out worker -------------------------------------------------------------

    def work(
        self,
        once: bool = False,
        poll: float = 0.2,
        stop: Callable[[], bool] | None = None,
        warn: Callable[[SchemalessError], None] | None = None,
        progress: Callable[[WorkRound], None] | None = None,
    ) -> int:
        """Fan posts out from the change feed under the subscription ``feeds_<name>``;
        ``once``: until caught up; ``stop``: asked after each round, the worker returns
        when it says so (a round's fan-out done and acknowledged).  How many posts were
        handled.

        A server that does not answer holds back only what needs it: the feed is read
        server by server, each part of a post's fan-out is written where its server
        answers, and what failed is owed (retried each round); the subscription is
        acknowledged only up to before the oldest change of a post owed, so a crash
        does it again (inbox rows are never doubled); the feed's shards are grouped by
        server again when the map changes (a move).  ``warn`` hears of an outage
        when it begins; ``once`` raises it when caught up (docs/architecture.md,
        "Edges and feeds").  ``progress`` hears of each round (``WorkRound``)."""
        _check_seconds("poll", poll)
        sub = self.ds.subscribe(self.subscription)
        self._pulled |= self._pulled_list()
        topo = self.ds.cluster.current()
        feeds = self._feeds(topo, sub.shards, sub.positions)
        feeds[0].check_on()
        owed, acked, handled, failing = _Owed(), dict(sub.positions), 0, False
        while True:
            events, more, error = self._read(feeds) if owed.size() < _OWED else ([], False, None)
            posts = [e for e in events if self._is_post(e)]
            handled += len(posts)
            error = self._deliver(posts, owed) or error
            held = owed.hold({s: p for f in feeds for s, p in f.positions.items()})
            if held != acked:
                sub.ack(encode_cursor(held))
                acked = held
            if error is not None and not failing and warn is not None:
                warn(error)
            failing = error is not None
            if progress is not None:
                progress(WorkRound(len(posts), owed.size(), failing, _behind(events, more)))
            if stop is not None and stop():
                return handled
            now = self.ds.cluster.current()
            if now.map_version != topo.map_version:
                positions = {s: p for f in feeds for s, p in f.positions.items()}
                topo, feeds = now, self._feeds(now, sub.shards, positions)
            if not events and not more:
                if once and error is not None:
                    raise error
                if once:
                    return handled
                time.sleep(poll)

    def _feeds(
        self, topo: Topology, shards: Sequence[int], positions: Mapping[int, Position]
    ) -> list[ChangeFeed]:
        """A change feed per server of ``topo`` over its ``shards``, from ``positions``,
        so a server that does not answer holds back only its own shards."""
        groups = by_server(topo, list(shards), int)
        return [ChangeFeed(self.ds.reader, positions, group) for group in groups.values()]

    def _read(self, feeds: list[ChangeFeed]) -> tuple[list[ChangeEvent], bool, _Failed]:
        """A round of each server's feed: the events of those that answered, whether
        one has more at once, and why one did not answer."""
        events: list[ChangeEvent] = []
        more, error = False, None
        for feed in feeds:
            try:
                found, full = feed.next_round()
            except TransientError as exc:
                error = error or exc
                continue
            events += found
            more = more or full
        return events, more, error

    def _is_post(self, e: ChangeEvent) -> bool:
        return e.entity is not None and e.entity.get("feed") == self.name and _is_id(e.entity)

    def _deliver(self, posts: list[ChangeEvent], owed: _Owed) -> _Failed:
        """Write the inbox rows ``owed`` holds, then fan out its posts and ``posts``;
        what fails is owed again; why a server did not answer."""
        owed.rows, error = self._insert_inbox(owed.rows)
        posts, owed.events = owed.events + posts, []
        if not posts:
            return error
        owed.note(posts)
        stored, why = self._write_posts([(_author(e), e.version, e.id) for e in posts])
        owed.events = [e for e in posts if e.id not in stored]
        by_author: dict[bytes, list[ChangeEvent]] = {}
        for e in posts:
            if e.id in stored:
                by_author.setdefault(_author(e), []).append(e)
        try:
            counts = self.graph.counts_inverse(set(by_author) - self._pulled)
        except TransientError as exc:  # an author's server, since its posts row
            owed.events = posts
            return exc
        rows: list[_InboxRow] = []
        for author, events in by_author.items():
            try:
                rows += self._inbox_rows(author, events, stored, counts.get(author, 0))
            except TransientError as exc:  # its pull (every server) or its followers
                owed.events += events
                why = why or exc
        failed, late = self._insert_inbox(rows)
        owed.rows += failed
        return error or why or late

    def _inbox_rows(
        self, author: bytes, posts: list[ChangeEvent], stored: Mapping[bytes, int], followers: int
    ) -> list[_InboxRow]:
        """The inbox rows of an author's ``posts`` (each at its posts row's time in
        ``stored``): one per follower, none if the author is pulled (from now on, with
        more than ``pull_threshold`` followers)."""
        if followers > self.pull_threshold:
            self._pull(author)
        if author in self._pulled:
            return []
        shard_of = self.ds.cluster.shard_of_id
        mine = [(stored[e.id], e.id, author) for e in posts]
        return [
            (shard, follower, row)
            for chunk in self.graph.sources(author, _FAN)
            for follower in chunk
            for shard in [shard_of(follower)]  # hashed once, whatever its posts
            for row in mine
        ]

    def _pull(self, author: bytes) -> None:
        """Put an author on every server's pulled list (server-wide rows of no
        logical shard: an administrative batch, as DDL)."""
        if author in self._pulled:
            return

        def build(dbs: list[str]) -> Statement:
            stmts = [
                f"INSERT IGNORE INTO {quote(db, self.pulled)} (`author`, `since`) VALUES (%s, %s)"
                for db in dbs
            ]
            return admin(stmts), [v for _ in dbs for v in (author, now_us())]

        topo = self.ds.cluster.current()
        self.ds.cluster.scatter(topo, {sid: [topo.owned_db or ""] for sid in topo.servers}, build)
        self._pulled.add(author)

    def _pulled_list(self) -> set[bytes]:
        """The authors on the pulled list (the copy of logical shard 0's server)."""

        def run() -> set[bytes]:
            topo = self.ds.cluster.current()
            sql = f"SELECT `author` FROM {self._q(topo, self.pulled)}"
            rows = self._server(topo, 0).run(guarded([sql], topo.owned_db, [0]))[0]
            return {bytes(r[0]) for r in rows}

        return set(self.ds.calls.call(run, self.timeout))

    def settle(self, timeout: float = 30.0) -> bool:
        """Wait until the worker has acknowledged every change made before this call
        (every acknowledged post fanned out); False after ``timeout`` seconds."""
        _check_seconds("timeout", timeout)
        heads = self._heads()
        until = time.monotonic() + timeout
        while True:
            done = self.ds.subscribe(self.subscription).positions
            if all(isinstance(p, int) and p >= heads.get(s, 0) for s, p in done.items()):
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(0.05)

    def _heads(self) -> dict[int, int]:
        """Each logical shard's change feed head (its newest change number)."""

        def run() -> dict[int, int]:
            topo = self.ds.cluster.current()

            def build(sid: int) -> Statement:
                shards = topo.shards_of(sid)
                head = self._q(topo, "changes_head")
                marks = ", ".join(str(int(s)) for s in shards)
                sql = f"SELECT `shard`, `seq` FROM {head} WHERE `shard` IN ({marks})"
                return guarded([sql], topo.owned_db, shards), ()

            groups = {sid: sid for sid in topo.servers if topo.shards_of(sid)}
            results = self.ds.cluster.scatter(topo, groups, build).results
            return {int(s): int(q) for rows in results.values() for s, q in rows[0]}

        return self.ds.calls.call(run, self.timeout)

    # -- helpers ------------------------------------------------------------------------

    def _q(self, topo: Topology, table: str) -> str:
        assert topo.owned_db is not None
        return quote(topo.owned_db, table)

    def _server(self, topo: Topology, shard: int) -> Any:
        return self.ds.cluster.server_of_shard(topo, shard)

    def _on(self, node: bytes, fn: Callable[[Topology, int], Any]) -> Any:
        return self._on_shard(self.ds.cluster.shard_of_id(node), fn)

    def _on_shard(self, shard: int, fn: Callable[[Topology, int], Any]) -> Any:
        return self.ds.calls.call(lambda: fn(self.ds.cluster.current(), shard), self.timeout)


@dataclass(frozen=True)
class WorkRound:
    """One round of the fan-out worker (``Feeds.work(progress=...)``): the posts it
    read, the posts and inbox rows it still owes, whether a server did not answer, and
    how far behind the change feed it is (seconds; 0 when caught up)."""

    posts: int
    owed: int
    failing: bool
    behind_s: float


def _behind(events: list[ChangeEvent], more: bool) -> float:
    """Seconds since the newest change a round read was written, if more wait."""
    if not more or not events:
        return 0.0
    return max(0.0, time.time() - max(e.at for e in events) / 1e6)


@dataclass
class _Owed:
    """What the fan-out worker read and has not delivered: posts to fan out again whole
    (their author's server did not answer) and inbox rows to write again (their
    reader's server did not), and each post's change, which the subscription's
    position must not pass."""

    events: list[ChangeEvent] = field(default_factory=list)
    rows: list[_InboxRow] = field(default_factory=list)
    changes: dict[bytes, tuple[int, int | None]] = field(default_factory=dict)

    def size(self) -> int:
        return len(self.events) + len(self.rows)

    def note(self, posts: Iterable[ChangeEvent]) -> None:
        """Each post's oldest change read (a later version's comes after it)."""
        for e in posts:
            self.changes.setdefault(e.id, (e.shard, e.seq))

    def hold(self, positions: Mapping[int, Position]) -> dict[int, Position]:
        """``positions``, each logical shard's kept before the oldest change of a post
        still owed (the changes of the others forgotten)."""
        owed = {e.id for e in self.events} | {row[1] for _, _, row in self.rows}
        self.changes = {p: c for p, c in self.changes.items() if p in owed}
        held = dict(positions)
        for shard, seq in self.changes.values():
            pos = held[shard]
            if isinstance(pos, int) and seq is not None:  # a feed's change, not a snapshot
                held[shard] = min(pos, seq - 1)
        return held


def _check_name(name: object) -> None:
    """A feed's name: an edge type's (``check_type``), of 30 characters at most."""
    try:
        if len(check_type(name)) <= 30:
            return
    except InvalidQuery:
        pass
    raise InvalidQuery(
        f"invalid feed name {name!r}: use lower-case letters, digits and single '_'"
        " (at most 30, starting with a letter)"
    )


def _check_seconds(name: str, value: object) -> None:
    """Refuse ``value`` unless it is a number of seconds >= 0 (``InvalidQuery``)."""
    if not isinstance(value, (int, float)) or not value >= 0:
        raise InvalidQuery(f"{name} must be a number of seconds >= 0, got {value!r}")


def _author(e: ChangeEvent) -> bytes:
    assert e.entity is not None  # a post's event
    return to_id(e.entity["author"])


def _unreachable(errors: Mapping[int, SchemalessError]) -> _Failed:
    """The first of a partial scatter's errors, each a server that did not answer
    (any other error is raised)."""
    unreachable_only(errors)
    return next(iter(errors.values()), None)


@functools.lru_cache(maxsize=4096)
def _home_sql(db: str, name: str, graph: str, shard: int, n: int, after: bool) -> str:
    """A home page's read on the user's server (``_home_rows``) and its ownership check:
    the inbox rows of authors still followed, the user's own posts, the pulled
    followees; built once per (shard, n, keyset or not)."""
    inbox, _, pulled = _tables(name)
    follows = quote(db, table_names(graph)[0])
    s = int(shard)
    select = (
        "(SELECT STRAIGHT_JOIN 0 AS `pulled`, i.`at`, i.`post`, i.`author`"
        f" FROM {quote(db, inbox)} i JOIN {follows} f FORCE INDEX (PRIMARY)"
        f" ON f.`shard` = {s} AND f.`src` = i.`user` AND f.`dst` = i.`author`"
        f" WHERE i.`shard` = {s} AND i.`user` = %s{_keyset('i.', after)}"
        f" ORDER BY i.`at` DESC, i.`post` DESC LIMIT {int(n)})"
        f" UNION ALL {_posts_sql(db, name, s, after, n)}"
        f" UNION ALL (SELECT 1, 0, NULL, p.`author` FROM {quote(db, pulled)} p"
        f" JOIN {follows} f ON f.`shard` = {s} AND f.`src` = %s AND f.`dst` = p.`author`)"
    )
    return guarded([select], db, (s,))


@functools.lru_cache(maxsize=4096)
def _posts_sql(db: str, name: str, shard: int, after: bool, n: int) -> str:
    """The newest ``n`` posts rows of an author (``%s``) on ``shard``, parenthesized,
    read down the clustered key (the planner would take ``once`` and sort them all)."""
    return (
        f"(SELECT 0 AS `pulled`, `at`, `post`, `author` FROM {quote(db, _tables(name)[1])}"
        f" FORCE INDEX (PRIMARY) WHERE `shard` = {int(shard)} AND `author` = %s"
        f"{_keyset('', after)} ORDER BY `at` DESC, `post` DESC LIMIT {int(n)})"
    )


def _is_id(entity: Mapping[str, Any]) -> bool:
    try:
        to_id(entity.get("author"))
    except SchemalessError:
        return False
    return True


def _row(r: Any) -> _Row:
    """(at, post, author) of a read's row (``pulled``, at, post, author)."""
    return int(r[1]), bytes(r[2]), bytes(r[3])


def _newest(rows: list[_Row], n: int) -> list[_Row]:
    """The ``n`` newest rows, each post once."""
    seen: dict[bytes, _Row] = {}
    for row in rows:
        seen.setdefault(row[1], row)
    return sorted(seen.values(), key=lambda r: (r[0], r[1]), reverse=True)[:n]


def _cursor(name: str, kind: str, node: bytes, after: tuple[int, bytes]) -> str:
    return pack_cursor(_CURSOR, [name, kind, node, after[0], after[1]])


def _decode_cursor(cursor: object, name: str, kind: str, node: bytes) -> tuple[int, bytes]:
    """A cursor of this feed's ``kind`` page of ``node``; ``InvalidQuery`` otherwise
    (malformed, or another user's timeline)."""
    got = unpack_cursor(cursor, _CURSOR, "a timeline cursor")
    if not (isinstance(got, list) and len(got) == 5 and isinstance(got[3], int)):
        raise InvalidCursor(f"not a timeline cursor: {str(cursor)[:40]!r}")
    if got[:3] != [name, kind, node] or not isinstance(got[4], bytes):
        raise InvalidCursor(f"this cursor pages another timeline, not this {kind} of {name!r}")
    return got[3], got[4]
