"""Least-privilege grants for the three users of a datastore, generated from its catalog.

MariaDB table- and column-level grants need concrete database and table names, so the
statements are built from the shard map and the index list (re-run after adding an
index, and in the layout of a database per logical shard after moving shards):

* ``app``, the application: SELECT on the catalog, INSERT, UPDATE, DELETE on its
  ``clients`` (the write latency it reports) and, with the change feed on, on
  ``feed_positions`` (subscriptions); INSERT, UPDATE on ``blocks`` (a write that meets a
  building index with values it cannot hold); SELECT, INSERT, UPDATE, DELETE on every
  shard database (owned layout: the data database ``<prefix>_data``), on every server,
  so a shard that moves keeps working, which covers the tables of edge types and
  timelines too (the admin creates those: ``schemaless edges create``, ``feeds
  create``); no DDL.
* ``cleaner``: SELECT on the catalog; INSERT, UPDATE, DELETE on its ``checkpoints``,
  ``deferrals`` and ``status``; UPDATE of ``state`` and ``changed`` in ``indexes`` (to
  mark an index ready).  On each shard database, on the server holding it (owned
  layout: on the data database, on every server, so moves need no new grants): SELECT;
  INSERT, UPDATE, DELETE on each maintained index table; on ``entities`` only ``INSERT
  (id, version, updated)`` (owned layout: and ``shard``) and ``UPDATE (version,
  updated)``: fencing tombstones and raised versions, never a body (except ``UPDATE
  (body)`` in a datastore with an expiry property: tombstones of expired entities),
  never a delete (so no tombstone purge); DELETE on the change feed's ``changes`` (its
  trim; with an expiry property also INSERT there and UPDATE on ``changes_head``: an
  expiry's delete writes its change); with a counted index, INSERT, UPDATE, DELETE on
  ``counts`` and ``counted_keys`` (the counts' backfill; an expiry's delete).  On every
  server, CREATE, SELECT, INSERT, UPDATE on the throttle's canary database
  (``<prefix>_canary``, which holds no data).
* ``admin``: ALL PRIVILEGES on every database of the datastore (``<prefix>\\_%``, which
  also covers the side copies of shard moves and the data database), on every server.

The owned layout's guard triggers run with the rights of their definer (the admin who
created the tables), so the app and the Cleaner need no right on ``owned`` beyond the
SELECT that the ownership check ending each batch reads it with (and no TRIGGER).

GRANT takes no statement parameters, so the user and host are checked against strict
patterns (no quotes, backticks, backslashes, semicolons or spaces) and database names
come only from the validated prefix.  In database-level grants (``db.*``) the ``_`` of
a name is escaped: MariaDB reads it as a wildcard there.  Grants never create a user:
applying them runs with ``NO_AUTO_CREATE_USER`` (otherwise MariaDB would create a
passwordless account).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import MySQLdb

from .connection import Batch, gather_partial
from .dsn import Address
from .errors import SchemalessError
from .names import escape_wildcards, quote
from .owned import admin
from .schema import canary_db, shard_db

if TYPE_CHECKING:
    from .store import DataStore
    from .topology import Topology

__all__ = [
    "ROLES",
    "GrantError",
    "account",
    "apply_grants",
    "check_account",
    "grant_plan",
    "grant_statements",
]

#: The roles ``grant_plan`` knows.
ROLES = ("app", "cleaner", "admin")

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}\Z")
_HOST = re.compile(r"[A-Za-z0-9_.%:/-]{1,255}\Z")
_ACCOUNT = re.compile(r"'([^'\\]*)'@'([^'\\]*)'\Z")
_NO_SUCH_USER = 1133  # "Can't find any matching row in the user table"


class GrantError(SchemalessError):
    """A user or host name that cannot go into a GRANT, an unknown role, or a user
    that does not exist on a server."""


def account(user: object, host: object = "%") -> str:
    """``'user'@'host'`` after checking both parts (letters, digits and ``_.-``; the
    host also ``%`` and ``:/`` for wildcards, IPv6 and netmasks)."""
    if not isinstance(user, str) or not _USER.match(user):
        raise GrantError(
            f"invalid user name {user!r}: use letters, digits and '_.-' (at most 80, "
            "not starting with '.' or '-')"
        )
    if not isinstance(host, str) or not _HOST.match(host):
        raise GrantError(
            f"invalid host {host!r}: use a host name, an IP address, or a pattern "
            "with '%' (letters, digits and '_.%:/-')"
        )
    return f"'{user}'@'{host}'"


def check_account(text: object) -> str:
    """A user written ``'name'@'host'``, checked part by part; returned unchanged."""
    match = _ACCOUNT.match(text) if isinstance(text, str) else None
    if match is None:
        raise GrantError(f"invalid account {text!r}: write it 'name'@'host'")
    return account(match.group(1), match.group(2))


def _role(role: object) -> str:
    if role not in ROLES:
        raise GrantError(f"unknown role {role!r}: use {', '.join(ROLES)}")
    return str(role)


def grant_plan(store: DataStore, role: str, user: str) -> dict[Address, list[str]]:
    """The GRANT statements of ``role`` for ``user`` (``'name'@'host'``), per server
    (in server order, the catalog's server first), from the catalog as it is now."""
    role, who = _role(role), check_account(user)
    topo = store.cluster.refresh()
    catalog_db = store.cluster.catalog.db
    catalog_at = store.cluster.catalog.server.address
    plan: dict[Address, list[str]] = {catalog_at: []}
    plan.update({topo.servers[sid]: [] for sid in sorted(topo.servers)})

    def grant(at: Address, privileges: str, target: str) -> None:
        plan[at].append(f"GRANT {privileges} ON {target} TO {who}")

    if role == "admin":
        pattern = escape_wildcards(topo.prefix) + "\\_%"
        for at in plan:
            grant(at, "ALL PRIVILEGES", f"`{pattern}`.*")
        return plan
    grant(catalog_at, "SELECT", _every_table(catalog_db))
    if role == "app":
        grant(catalog_at, "INSERT, UPDATE, DELETE", quote(catalog_db, "clients"))
        # a write that meets a building index with values it cannot hold blocks it there
        grant(catalog_at, "INSERT, UPDATE", quote(catalog_db, "blocks"))
        if topo.changes:  # subscriptions of the change feed keep their positions there
            grant(catalog_at, "INSERT, UPDATE, DELETE", quote(catalog_db, "feed_positions"))
        # Database-level DML on every shard database (owned layout: the data database)
        # on every server: one a server does not hold gives nothing, until a shard
        # moves there.
        for at in plan:
            for db in dict.fromkeys(topo.dbs):
                grant(at, "SELECT, INSERT, UPDATE, DELETE", _every_table(db))
        return plan
    for table in ("checkpoints", "deferrals", "status"):
        grant(catalog_at, "INSERT, UPDATE, DELETE", quote(catalog_db, table))
    grant(catalog_at, "UPDATE (`state`, `changed`)", quote(catalog_db, "indexes"))
    for at in plan:
        grant(at, "CREATE, SELECT, INSERT, UPDATE", _every_table(canary_db(topo.prefix)))
    for at, privileges, target in _cleaner_data(topo):
        grant(at, privileges, target)
    return plan


def _cleaner_data(topo: Topology) -> Iterator[tuple[Address, str, str]]:
    """The Cleaner's grants on the data: (server, privileges, table or ``db.*``).

    In the owned layout every server has the same data database (a move's target
    needs its tables first): the grants are on every server and follow moves; in the
    layout of a database per logical shard, each shard's on the server holding it."""
    maintained = sorted(topo.maintained(), key=lambda index: index.name)
    # the expiry writes tombstones (``body`` = NULL) of expired entities, through the
    # write protocol: with the change feed on, their change rows too
    expiring = topo.expire_on is not None
    updates = "`version`, `updated`" + (", `body`" if expiring else "")
    inserts = "`id`, `version`, `updated`"
    if topo.owned_db is not None:
        places = [(at, topo.owned_db) for _, at in sorted(topo.servers.items())]
        inserts = "`shard`, " + inserts  # rows name their shard
    else:
        places = [
            (topo.servers[sid], shard_db(topo.prefix, shard))
            for shard, sid in enumerate(topo.shard_servers)
        ]
    for at, db in places:
        yield at, "SELECT", _every_table(db)
        yield at, f"INSERT ({inserts}), UPDATE ({updates})", quote(db, "entities")
        for index in maintained:
            yield at, "INSERT, UPDATE, DELETE, INDEX", quote(db, index.table)
        if topo.counted:  # the counts' backfill, the expiry
            for table in ("counts", "counted_keys"):
                yield at, "INSERT, UPDATE, DELETE", quote(db, table)
        if topo.changes:  # the trim of the change feed
            yield at, "INSERT, DELETE" if expiring else "DELETE", quote(db, "changes")
            if expiring:
                yield at, "UPDATE", quote(db, "changes_head")


def _every_table(db: str) -> str:
    """``db.*`` for a database-level grant, where MariaDB reads ``_`` in the name as a
    wildcard: escaped, or ``a_b_0001.*`` would also grant ``axb_0001``, a shard of
    another datastore."""
    return f"`{escape_wildcards(db)}`.*"


def grant_statements(store: DataStore, role: str, user: str) -> list[str]:
    """Every statement of ``grant_plan``, server after server (see there)."""
    return [sql for stmts in grant_plan(store, role, user).values() for sql in stmts]


def apply_grants(store: DataStore, role: str, user: str) -> dict[Address, int]:
    """Run ``grant_plan`` on its servers (in parallel) with this store's connection,
    which needs the GRANT OPTION; how many statements each server ran.

    The user must exist on every server: grants never create one (``GrantError``).
    """
    who = check_account(user)
    plan = {at: stmts for at, stmts in grant_plan(store, role, who).items() if stmts}
    batches = {
        at: Batch(
            store.cluster.server(at),
            admin(  # grants: no ownership check
                [
                    "SET @schemaless_sql_mode = @@SESSION.sql_mode",
                    "SET SESSION sql_mode = CONCAT(@@SESSION.sql_mode, ',NO_AUTO_CREATE_USER')",
                    *stmts,
                    "SET SESSION sql_mode = @schemaless_sql_mode",
                ]
            ),
        )
        for at, stmts in plan.items()
    }
    _results, errors = gather_partial(batches)
    for at, exc in errors.items():
        cause = exc.__cause__
        if isinstance(cause, MySQLdb.Error) and cause.args[:1] == (_NO_SUCH_USER,):
            raise GrantError(
                f"{at}: user {who} does not exist there; create it first "
                f"(CREATE USER {who} IDENTIFIED BY ...): grants never create users"
            ) from exc
        raise exc
    return {at: len(stmts) for at, stmts in plan.items()}
