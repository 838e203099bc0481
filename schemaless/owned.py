"""The owned layout: one database per server, the logical shard a column.

Each server holds ``<prefix>_data`` with one ``entities`` table, one table per index,
the change feed's tables, the index epoch's fence, and ``owned``: a row per logical
shard the server holds (docs/architecture.md, "The owned layout").  Two things keep a
client with a stale map from reading or writing a shard that moved away, as a missing
table does in the layout of a database per shard, and both end in the same error
(``TableMissing``), so the client follows the map as it always has:

* the guard: every table's ``shard`` is a foreign key of ``owned`` (``GUARD_KEY``), so
  InnoDB refuses a new row of a shard the server does not own (error 1452) and holds
  its ``owned`` row in share mode to the commit, which a move's fence (deleting that
  row, ``disown_sql``) waits for; a ``BEFORE UPDATE`` trigger does the same for a
  changed row (error 1146), including an upsert's, which the key does not check;
* every batch that names the data database and rests on what it reads or on a write
  that may match no row ends with its check: a read's verdict (:func:`guarded`), which
  ``Server.receive`` reads, or :func:`check_sql` before its ``COMMIT``, which fails the
  batch; or it begins with that under the ``owned`` rows' shared locks
  (:func:`checked_first`): a read or an unapplied write is never taken from a shard the
  server gave away.  A write batch whose every write is guarded
  needs no check (``triggered``); one whose writes prove ownership only where they
  apply is ``tentative`` (what did not apply is sent again ``checked_first``); a point
  read checks in its own statement, and every other read (:func:`guarded`) ends with
  a plain ``SELECT`` of its verdict, which ``Server.receive`` checks.

``Server.send`` refuses a batch that names the data database without the check or one
of the marks (``ADMIN``, ``TRIGGERED``, ``TENTATIVE``), so a statement cannot forget
it, and an ``INSERT IGNORE`` there that does not follow a check holding its shards'
``owned`` rows (``checked_first``), whose ``IGNORE`` would make the key's refusal a
warning.
"""

from __future__ import annotations

import collections
import functools
import hashlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import TableMissing
from .names import quote

if TYPE_CHECKING:
    from .index import Index

__all__ = [
    "ADMIN",
    "CHECK",
    "COPYING",
    "DATABASES",
    "GUARD_KEY",
    "HELD",
    "LAYOUTS",
    "LISTED_MAX",
    "LOCKED",
    "OWNED",
    "TENTATIVE",
    "TRIGGERED",
    "UNCHECKED",
    "VERDICT",
    "Shards",
    "admin",
    "among",
    "changes_tables_sql",
    "check_sql",
    "checked_first",
    "copying",
    "data_db",
    "digest",
    "digest_sql",
    "disown_sql",
    "entities_table_sql",
    "guard_sql",
    "guarded",
    "in_guarded_transaction",
    "in_transaction",
    "index_table_sql",
    "locked",
    "owned_rows_sql",
    "owns_sql",
    "placement",
    "shards_sql",
    "tentative",
    "triggered",
    "unguarded",
    "upsert_guard_sql",
    "verdict",
    "verdict_sql",
]

OWNED = "owned"
DATABASES = "databases"
LAYOUTS = (OWNED, DATABASES)

#: The comment that marks the ownership check; ``Server.send`` looks for it.
CHECK = "/*schemaless:owned*/"
#: The comment that ends a read's verdict, the last statement of a ``guarded`` batch:
#: a plain ``SELECT`` of 1 when every shard the read names is owned here, else 0, which
#: ``Server.receive`` takes off the results of a batch that ends with this mark
#: (``TableMissing`` on 0).
VERDICT = "/*schemaless:verdict*/"
#: The comment that marks an administrative batch (DDL, a move's copy): no check.
ADMIN = "/*schemaless:admin*/"
#: The comment that marks a batch that needs no check (``triggered``): every write in
#: it meets the guard, its deletes remove only what may go, it interprets no read.
TRIGGERED = "/*schemaless:triggered*/"
#: The comment that marks a write batch whose writes prove ownership only where they
#: apply (``tentative``): a write that affected no row proves nothing, and its caller
#: never takes it as an answer (``protocol.Writer``: it sends it again ``checked_first``
#: or reads the stored state with a checked read).
TENTATIVE = "/*schemaless:tentative*/"
#: The comment that marks a check that holds the ``owned`` rows it reads to the commit
#: (``checked_first``): an ``INSERT IGNORE`` may follow it (the key cannot refuse then).
HELD = "/*schemaless:held*/"
#: The session variable a move's copy sets to the shard it copies into the target,
#: whose ``owned`` row comes only when the copy is complete (its inserts are sent
#: without the key's check, ``UNCHECKED``).
COPYING = "@schemaless_copying"
#: The guard of a table's new rows, in its ``CREATE TABLE`` (``owned`` is resolved in
#: the table's own database): a few µs of the server's CPU a row, where a trigger's
#: lookup costs about 80 (docs/architecture.md, "The guard").
GUARD_KEY = "FOREIGN KEY (`shard`) REFERENCES `owned` (`shard`)"
#: The prefix of a statement sent without the key's check: a move's copy into the
#: target, whose ``owned`` row comes last (``copying``; ``disown_sql`` sets it with its
#: lock wait in one ``SET STATEMENT``: the key would refuse to delete an ``owned`` row
#: while the shard has rows).
UNCHECKED = "SET STATEMENT foreign_key_checks = 0 FOR "
#: The session variable a ``locked`` batch sets to the shards whose ``owned`` rows it
#: holds locked (comma-separated): the triggers skip their lookup for their rows.
LOCKED = "@schemaless_locked"

_REFUSED = "SQLSTATE '42S02' SET MYSQL_ERRNO = 1146, MESSAGE_TEXT ="
_R = TypeVar("_R", bound=Sequence[Any])
_MOVED = "a logical shard named is not on this server (moved): refresh the map"


def unguarded(sql: str) -> None:
    """Refuse a batch on the data database that has neither the ownership check nor
    the administrative mark, or a read's verdict but not as its last statement: a bug in
    the library, never sent."""
    if sql.startswith(ADMIN):
        return
    if CHECK not in sql and not sql.startswith((TRIGGERED, TENTATIVE)):
        raise RuntimeError(f"schemaless bug: a batch without the ownership check: {sql[:300]}")
    if "INSERT IGNORE" in sql and not 0 <= sql.find(HELD) < sql.find("INSERT IGNORE"):
        # IGNORE makes the key's refusal a warning: only where the owned rows are held
        raise RuntimeError(f"schemaless bug: INSERT IGNORE, owned rows not held: {sql[:300]}")
    if VERDICT in sql and sql.find(VERDICT) != len(sql) - len(VERDICT):
        # Server.receive reads the verdict of a batch that ends with its mark
        raise RuntimeError(f"schemaless bug: a read's verdict not last, or twice: {sql[:300]}")


def copying(shard: int, stmts: Sequence[str]) -> list[str]:
    """A move's writes of a shard's rows into its target before the target owns it:
    let through by the guard's triggers (``COPYING``, reset at the end: a failed
    batch's connection is dropped with it) and unchecked by its key."""
    return [
        f"SET {COPYING} = {int(shard)}",
        *(UNCHECKED + s for s in stmts),
        f"SET {COPYING} = NULL",
    ]


def disown_sql(db: str, shard: int) -> str:
    """Delete a shard's ``owned`` row (a move's fence, a rollback's target): it waits
    up to 10 s for every writer holding it (a lock wait timeout is retried), and the
    key is not checked (the shard's rows stay, unowned)."""
    return (
        "SET STATEMENT foreign_key_checks = 0, innodb_lock_wait_timeout = 10 FOR"
        f" DELETE FROM {quote(db, 'owned')} WHERE `shard` = {int(shard)}"
    )


def data_db(prefix: str) -> str:
    """The database of the owned layout, the same name on every server."""
    return f"{prefix}_data"


class Shards(tuple[int, ...]):
    """Logical shard numbers, sorted and distinct, hashed once: a map's shards of one
    server (``Topology.placed``), which every scatter's check, scan and digest names
    (re-sorting and re-hashing 2,048 of them cost a query about 0.3 ms)."""

    def __hash__(self) -> int:
        known: int | None = self.__dict__.get("hash")
        if known is None:
            known = self.__dict__["hash"] = super().__hash__()
        return known


def check_sql(db: str, shards: Iterable[int]) -> str:
    """Fail the batch (error 1146) unless every shard named is owned here."""
    return _check(db, _names(shards))


def _names(shards: Iterable[int]) -> tuple[int, ...]:
    """Shard numbers sorted and distinct (a map's ``Shards`` already are: kept)."""
    return shards if isinstance(shards, Shards) else tuple(sorted({int(s) for s in shards}))


@functools.lru_cache(maxsize=4096)
def _check(db: str, names: tuple[int, ...]) -> str:
    # cached by the tuple: rendering thousands of shards anew cost a scatter 1 ms
    short = ""
    if len(names) > LISTED_MAX:  # a scatter names all its server's shards: one row read
        short = f"NOT EXISTS ({_digest_row(db, names)}) AND "
    return _refuse_unless(f"{short}{_count(db, names)} < {len(names)}")


def _refuse_unless(failing: str, mark: str = CHECK) -> str:
    """A compound statement that fails the batch (error 1146) when ``failing`` holds."""
    return f"BEGIN NOT ATOMIC {mark} IF {failing} THEN SIGNAL {_REFUSED} '{_MOVED}'; END IF; END"


def _digest_row(db: str, names: tuple[int, ...]) -> str:
    """The server's ``owned_digest`` row if it owns exactly ``names`` (a subquery)."""
    return f"SELECT 1 FROM {quote(db, 'owned_digest')} d WHERE {owns_sql(names)}"


def _count(db: str, names: tuple[int, ...], lock: str = "") -> str:
    """How many of ``names`` are owned here (a subquery; ``lock``: its locking clause)."""
    return f"(SELECT COUNT(*) FROM {quote(db, 'owned')} WHERE {among(names)}{lock})"


#: The salt of each shard's hash in the digest (the same in ``digest_sql``'s triggers).
_SALT = "schemaless owned "


@functools.lru_cache(maxsize=65536)
def _hash(shard: int) -> tuple[int, int]:
    h = hashlib.sha256(f"{_SALT}{shard}".encode()).hexdigest()
    return int(h[:16], 16), int(h[16:32], 16)


@functools.lru_cache(maxsize=1024)
def digest(names: tuple[int, ...]) -> tuple[int, int, int]:
    """The digest of a set of shards (sorted, distinct) as ``owned_digest`` keeps it:
    how many, and the XOR of each one's 128-bit hash."""
    d0 = d1 = 0
    for s in names:
        h0, h1 = _hash(s)
        d0 ^= h0
        d1 ^= h1
    return len(names), d0, d1


def owns_sql(names: tuple[int, ...]) -> str:
    """A condition on ``owned_digest`` (aliased ``d``) that holds only if the server
    owns exactly these shards (sorted, distinct: a map's of that server): one row read."""
    n, d0, d1 = digest(names)
    return f"d.`one` = 1 AND d.`n` = {n} AND d.`d0` = {d0} AND d.`d1` = {d1}"


def _hash_sql(row: str, half: int) -> str:
    """Half of ``_hash`` of ``row``'s shard, in SQL."""
    start = 1 + 16 * half
    return (
        f"CAST(CONV(SUBSTRING(SHA2(CONCAT('{_SALT}', {row}.`shard`), 256), {start}, 16), 16, 10)"
        " AS UNSIGNED)"
    )


def digest_sql(db: str) -> list[str]:
    """``owned_digest``: one row, the ``digest`` of the server's ``owned`` rows, kept by
    triggers on ``owned`` in the transaction that inserts or deletes one (a fence, a
    move's handover), so it always describes the committed set; ``owned`` rows are
    never updated.  Made once from the rows already there, under their locks."""
    t, o = quote(db, "owned_digest"), quote(db, "owned")

    def change(name: str, when: str, row: str, sign: str) -> str:
        return (
            f"CREATE TRIGGER IF NOT EXISTS {quote(db, name)} AFTER {when} ON {o} FOR EACH ROW"
            f" UPDATE {t} SET `n` = `n` {sign} 1, `d0` = `d0` ^ {_hash_sql(row, 0)},"
            f" `d1` = `d1` ^ {_hash_sql(row, 1)} WHERE `one` = 1"
        )

    return [
        f"CREATE TABLE IF NOT EXISTS {t} (`one` TINYINT UNSIGNED NOT NULL PRIMARY KEY,"
        " `n` INT UNSIGNED NOT NULL, `d0` BIGINT UNSIGNED NOT NULL,"
        " `d1` BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB",
        change("owned_di", "INSERT", "NEW", "+"),
        change("owned_dd", "DELETE", "OLD", "-"),
        f"CREATE TRIGGER IF NOT EXISTS {quote(db, 'owned_du')} BEFORE UPDATE ON {o} FOR EACH"
        f" ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'owned rows are never updated'",
        "START TRANSACTION",
        f"SELECT COUNT(*) FROM {o} FOR UPDATE",
        f"INSERT IGNORE INTO {t} SELECT 1, COUNT(*), COALESCE(BIT_XOR({_hash_sql('o', 0)}), 0),"
        f" COALESCE(BIT_XOR({_hash_sql('o', 1)}), 0) FROM {o} o",
        "COMMIT",
    ]


#: Above this many shards the check describes them as a progression when it can: a
#: list of 2,048 cost the server 3.3-4.7 ms a check, ``shard MOD 2 = 0`` 0.7-0.8 ms.
LISTED_MAX = 64
_STEPS = range(1, 17)  # the progressions tried: every Nth shard (a map of N servers)


@functools.lru_cache(maxsize=4096)
def among(names: tuple[int, ...]) -> str:
    """The condition that a shard is one of ``names`` (sorted, distinct): a list, or,
    for many, the progression ``shard MOD step = r`` over their range that misses the
    fewest, with the shards it adds excluded and those it misses added (exact either
    way: the count of owned rows it selects equals ``len(names)`` only if every one of
    them is owned)."""
    listed = f"`shard` IN ({', '.join(str(int(s)) for s in names)})"
    if len(names) <= LISTED_MAX:
        return listed
    chosen = set(names)
    best: tuple[int, range, list[int], list[int]] | None = None
    for step in _STEPS:
        r = collections.Counter(s % step for s in names).most_common(1)[0][0]
        on = [s for s in names if s % step == r]
        span = range(on[0], on[-1] + 1, step)
        extra = [s for s in span if s not in chosen]
        missed = [s for s in names if s % step != r]
        if best is None or len(extra) + len(missed) < len(best[2]) + len(best[3]):
            best = (step, span, extra, missed)
    assert best is not None
    step, span, extra, missed = best
    if 2 * (len(extra) + len(missed)) >= len(names):
        return listed
    cond = (
        f"`shard` BETWEEN {span.start} AND {span[-1]} AND `shard` MOD {step} = {span.start % step}"
    )
    if extra:
        cond += f" AND `shard` NOT IN ({', '.join(map(str, extra))})"
    if missed:
        cond = f"({cond}) OR `shard` IN ({', '.join(map(str, missed))})"
    return f"({cond})"


def shards_sql(shards: Iterable[int]) -> str:
    """The condition that a row's ``shard`` is one of these (``among``'s form)."""
    return among(_names(shards))


def placement(n_shards: int, servers: int, layout: str) -> list[int]:
    """The server of each logical shard in a new datastore: in the owned layout
    contiguous blocks (each server's shards one range: its checks name one
    ``BETWEEN``), in the layout of databases every ``servers``-th shard."""
    if layout == OWNED:
        return [s * servers // n_shards for s in range(n_shards)]
    return [s % servers for s in range(n_shards)]


def admin(stmts: list[str]) -> str:
    """An administrative batch (DDL, a move's copy and fence): no ownership check."""
    return ADMIN + " " + ";\n".join(stmts)


def guarded(stmts: list[str], db: str | None, shards: Iterable[int]) -> str:
    """A read batch: its statements, then (owned layout: ``db`` given) its verdict, a
    plain ``SELECT`` of whether every shard named is owned here, read after the rows (a
    fence that commits in between shows) and checked by ``Server.receive``, which takes
    it off the results (``verdict``).  It costs the server about 17 µs, where a compound
    check that signals, or the read as a derived table joined to the ``owned`` rows, cost
    50-100 (docs/results/owned-layout.md, session 53)."""
    if db is not None:
        stmts = [*stmts, verdict_sql(db, shards)]
    return ";\n".join(stmts)


def verdict_sql(db: str, shards: Iterable[int]) -> str:
    """``SELECT`` 1 if every shard named is owned here, else 0 (marked ``VERDICT``)."""
    return _verdict(db, _names(shards))


@functools.lru_cache(maxsize=4096)
def _verdict(db: str, names: tuple[int, ...]) -> str:
    owned = f"{_count(db, names)} = {len(names)}"
    if len(names) > LISTED_MAX:  # a scatter names all its server's shards: one row read
        owned = f"EXISTS ({_digest_row(db, names)}) OR {owned}"
    return f"SELECT {CHECK} {owned} {VERDICT}"


def verdict(results: list[_R], where: str) -> list[_R]:
    """The results of a batch that ends with a verdict, without it; ``TableMissing`` if
    it says a shard named is not owned here (a move's fence, a stale map)."""
    said = results.pop() if results else ()
    if not (said and said[0][0]):
        raise TableMissing(f"{_MOVED}: {where}")
    return results


def in_transaction(stmts: list[str]) -> str:
    """Several statements share one commit (one redo-log flush)."""
    if len(stmts) > 1:
        stmts = ["START TRANSACTION", *stmts, "COMMIT"]
    return ";\n".join(stmts)


def triggered(stmts: list[str], db: str | None) -> str:
    """A write batch that needs no check (owned layout: ``db`` given): one transaction
    whose every insert, upsert or update that changes a row meets the guard (a shard not
    owned fails the whole batch, nothing committed), whose upserts that change nothing
    need no proof (docs/architecture.md, "The key guards changed index rows too") and
    whose deletes remove only what may go."""
    return _marked(TRIGGERED, stmts, db)


def tentative(stmts: list[str], db: str | None) -> str:
    """A write batch that proves ownership only where its writes apply (owned layout:
    ``db`` given): one transaction whose inserts and updates meet the guard, so each
    write that applied was of a shard owned here (a shard not owned fails the whole
    batch), and whose deletes remove only what may go.  An update that affected no row
    proves nothing (its row may have moved away with its shard): the caller sends it
    again ``checked_first``, or reads the stored state checked, before taking it as "not
    found" or "conflict".  A write that applies pays no check at all
    (docs/architecture.md, "The check")."""
    return _marked(TENTATIVE, stmts, db)


def _marked(mark: str, stmts: list[str], db: str | None) -> str:
    """``stmts`` in one transaction, marked (owned layout: ``db`` given) as needing no
    check of their own."""
    sql = in_transaction(stmts)
    return f"{mark} {sql}" if db is not None and stmts else sql


def checked_first(stmts: list[str], db: str | None, shards: Iterable[int]) -> str:
    """A write batch whose writes may match no row (owned layout: ``db`` given): one
    transaction that begins by reading the ``owned`` rows of every shard it names
    ``LOCK IN SHARE MODE``, failing unless each is there, and holds them to its
    ``COMMIT`` (a fence waits for it; one that came first fails it before any write),
    so a write that affected no row is an answer ("not found", "conflict") of the
    shard's owner."""
    if db is None:
        return in_transaction(stmts)
    names = _names(shards)
    failing = f"{_count(db, names, ' LOCK IN SHARE MODE')} < {len(names)}"
    check = _refuse_unless(failing, f"{CHECK} {HELD}")
    return ";\n".join(["START TRANSACTION", check, *stmts, "COMMIT"])


def locked(stmts: list[str], db: str | None, shards: Iterable[int]) -> str:
    """A write batch of many rows (owned layout: ``db`` given): ``checked_first``, so
    the ``owned`` rows of every shard it names are held from its start to its
    ``COMMIT``, and the guard's triggers skip their own lookup for those shards' rows
    (``LOCKED``, reset at the end; a failed batch's connection is dropped with it)."""
    if db is None:
        return in_transaction(stmts)
    names = _names(shards)
    listed = ",".join(map(str, names))
    batch = checked_first(stmts, db, names)
    return ";\n".join([f"SET {LOCKED} = '{listed}'", batch, f"SET {LOCKED} = NULL"])


def in_guarded_transaction(stmts: list[str], db: str | None, shards: Iterable[int]) -> str:
    """A write batch: one transaction, the check (owned layout) before its commit."""
    return in_transaction(stmts if db is None else [*stmts, check_sql(db, shards)])


def guard_sql(db: str, table: str) -> list[str]:
    """The trigger that refuses a changed row of a shard not owned here (``GUARD_KEY``,
    in the table's definition, refuses a new one): an ``UPDATE``'s, and an upsert's
    that met its key, which the foreign key does not check.  A move's copy into the
    target is let through (``COPYING``), and so are the shards a ``locked`` batch holds.
    Deletes are not guarded: every delete of the protocol removes what may go (a stale
    one leaves the moved copy a superset, which the Cleaner clears), and a move deletes
    its old rows after the fence."""
    return [_trigger(db, table, "UPDATE")]


def index_table_sql(db: str, index: Index, *, entity_key: bool = True) -> list[str]:
    """An index's table in the owned layout, with its guard: the key alone when its
    ``by_shard`` names the owner and version every write of a row changes
    (``Index.keyed_changes``), else the key and the update trigger."""
    made = index.create_table_sql(db, entity_key=entity_key, shard=True)
    return [made] if index.keyed_changes else [made, *guard_sql(db, index.table)]


def upsert_guard_sql(db: str, table: str) -> list[str]:
    """The guard of a table written only by upserts, with no ``GUARD_KEY``: a ``BEFORE
    INSERT`` trigger, which fires first for a row present too (an edge type's counts,
    whose rows the edge's own count trigger changes under the edge row's guard:
    docs/architecture.md, "Edges and feeds")."""
    return [_trigger(db, table, "INSERT")]


def _trigger(db: str, table: str, when: str) -> str:
    return (
        f"CREATE TRIGGER IF NOT EXISTS {quote(db, f'{table}_g{when[0].lower()}')}"
        f" BEFORE {when} ON {quote(db, table)} FOR EACH ROW"
        f" IF NOT ({COPYING} <=> NEW.`shard`)"
        f" AND NOT COALESCE(FIND_IN_SET(NEW.`shard`, {LOCKED}), 0) AND NOT EXISTS (SELECT 1 FROM"
        f" {quote(db, 'owned')} WHERE `shard` = NEW.`shard` LOCK IN SHARE MODE)"
        f" THEN SIGNAL {_REFUSED} 'this logical shard is not on this server (moved)'; END IF"
    )


def entities_table_sql(db: str) -> list[str]:
    """The server's database, ``owned`` and ``entities``, with its guard.  ``entities``
    is clustered on ``id`` (a read by id is one dive, the raw baseline's; ids are UUIDv7,
    so inserts mostly append); a shard's scans in insert order walk ``by_shard_added``
    (unique: ``added_id`` is unique within a shard, a move copies it), and the recent
    scan ``by_updated``, which names ``added_id`` for its order ``(updated, added_id)``.
    ``by_updated`` is unique and first, so it is ``GUARD_KEY``'s index: InnoDB checks the
    key for a row added and for every update that moves ``updated``, which each write
    of an entity does (``writes``): the guard of new and changed rows alike, with no
    trigger (docs/architecture.md, "The key guards changed entity rows too")."""
    return [
        f"CREATE DATABASE IF NOT EXISTS {quote(db)}",
        f"CREATE TABLE IF NOT EXISTS {quote(db, 'owned')} ("
        " `shard` SMALLINT UNSIGNED NOT NULL PRIMARY KEY) ENGINE=InnoDB",
        *digest_sql(db),
        f"CREATE TABLE IF NOT EXISTS {quote(db, 'entities')} ("
        " `shard` SMALLINT UNSIGNED NOT NULL,"
        " `added_id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,"
        " `id` BINARY(16) NOT NULL,"
        " `version` BIGINT UNSIGNED NOT NULL,"
        " `updated` BIGINT UNSIGNED NOT NULL,"
        " `body` MEDIUMBLOB NULL,"
        " PRIMARY KEY (`id`),"
        " UNIQUE KEY `by_updated` (`shard`, `updated`, `added_id`),"
        " UNIQUE KEY `by_shard_added` (`shard`, `added_id`),"
        " KEY `by_added` (`added_id`),"
        f" {GUARD_KEY}"
        ") ENGINE=InnoDB",
    ]


def changes_tables_sql(db: str) -> list[str]:
    """The change feed's tables, a head row per shard (``owned_rows_sql`` adds them)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {quote(db, 'changes')} ("
        " `shard` SMALLINT UNSIGNED NOT NULL,"
        " `seq` BIGINT UNSIGNED NOT NULL,"
        " `id` BINARY(16) NOT NULL,"
        " `version` BIGINT UNSIGNED NOT NULL,"
        " `body` MEDIUMBLOB NULL,"
        " `at` BIGINT UNSIGNED NOT NULL,"
        " PRIMARY KEY (`shard`, `seq`),"
        f" {GUARD_KEY}"
        ") ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {quote(db, 'changes_head')} ("
        " `shard` SMALLINT UNSIGNED NOT NULL PRIMARY KEY,"
        " `seq` BIGINT UNSIGNED NOT NULL,"
        f" {GUARD_KEY}"
        ") ENGINE=InnoDB",
        *guard_sql(db, "changes"),
        *guard_sql(db, "changes_head"),
    ]


def owned_rows_sql(db: str, shards: Iterable[int], *, changes: bool) -> list[str]:
    """The ``owned`` rows of shards (and their change feed head rows)."""
    names = sorted(set(shards))
    if not names:
        return []
    out = [
        f"INSERT IGNORE INTO {quote(db, 'owned')} (`shard`) VALUES "
        + ", ".join(f"({int(s)})" for s in names)
    ]
    if changes:
        out.append(
            f"INSERT IGNORE INTO {quote(db, 'changes_head')} (`shard`, `seq`) VALUES "
            + ", ".join(f"({int(s)}, 0)" for s in names)
        )
    return out
