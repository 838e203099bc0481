"""DDL of the catalog database and of each logical shard's ``entities`` and fence
tables."""

from __future__ import annotations

import re

from .errors import CatalogError
from .names import quote

__all__ = [
    "CATALOG_TABLES",
    "canary_db",
    "changes_tables_sql",
    "check_prefix",
    "entities_table_sql",
    "fence_epoch",
    "fence_table",
    "fence_table_sql",
    "shard_db",
]

_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,39}\Z")
_FENCE = re.compile(r"fence_([0-9]{1,18})\Z")


def check_prefix(prefix: object) -> str:
    """A datastore prefix: lowercase letters, digits, '_' (names its databases)."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise CatalogError(
            f"invalid datastore prefix {prefix!r}: lowercase letters, digits and '_', "
            "starting with a letter, at most 40"
        )
    return prefix


def shard_db(prefix: str, shard: int) -> str:
    """The database of one logical shard: ``<prefix>_0000``."""
    return f"{prefix}_{shard:04d}"


def canary_db(prefix: str) -> str:
    """The database of the Cleaner throttle's canary table, on every server."""
    return f"{prefix}_canary"


def entities_table_sql(db: str) -> str:
    """The entities table of one logical shard (a NULL body is a tombstone)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {quote(db, 'entities')} ("
        " `added_id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,"
        " `id` BINARY(16) NOT NULL,"
        " `version` BIGINT UNSIGNED NOT NULL,"
        " `updated` BIGINT UNSIGNED NOT NULL,"
        " `body` MEDIUMBLOB NULL,"
        " PRIMARY KEY (`added_id`),"
        " UNIQUE KEY `by_id` (`id`),"
        " KEY `by_updated` (`updated`)"
        ") ENGINE=InnoDB"
    )


def changes_tables_sql(db: str) -> list[str]:
    """The change feed's tables of one logical shard: the changes in commit order, and
    the head row that numbers them (docs/architecture.md, "The change feed")."""
    return [
        f"CREATE TABLE IF NOT EXISTS {quote(db, 'changes')} ("
        " `seq` BIGINT UNSIGNED NOT NULL PRIMARY KEY,"
        " `id` BINARY(16) NOT NULL,"
        " `version` BIGINT UNSIGNED NOT NULL,"
        " `body` MEDIUMBLOB NULL,"
        " `at` BIGINT UNSIGNED NOT NULL"
        ") ENGINE=InnoDB",
        f"CREATE TABLE IF NOT EXISTS {quote(db, 'changes_head')} ("
        " `one` TINYINT UNSIGNED NOT NULL PRIMARY KEY,"
        " `seq` BIGINT UNSIGNED NOT NULL"
        ") ENGINE=InnoDB",
        f"INSERT IGNORE INTO {quote(db, 'changes_head')} (`one`, `seq`) VALUES (1, 0)",
    ]


def fence_table(epoch: int) -> str:
    """The fence table of an index epoch: every write of a body names it, so a writer
    whose map predates an index declaration fails once the declaration drops it."""
    return f"fence_{int(epoch)}"


def fence_epoch(table: str) -> int | None:
    """The index epoch a table name fences, or None if it is not a fence table."""
    match = _FENCE.match(table)
    return int(match.group(1)) if match else None


def fence_table_sql(db: str, epoch: int) -> str:
    """A shard's fence table: always empty, only its name matters, so MEMORY (no
    tablespace pages or files: a server out of space still has its fences, and
    reading one costs less than an InnoDB table)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {quote(db, fence_table(epoch))}"
        " (`unused` TINYINT NOT NULL PRIMARY KEY) ENGINE=MEMORY"
    )


#: Catalog tables, created in ``<prefix>_catalog`` on the first server.
CATALOG_TABLES = {
    "meta": ("`name` VARCHAR(64) NOT NULL PRIMARY KEY, `value` VARCHAR(255) NOT NULL"),
    "servers": (
        "`server_id` INT UNSIGNED NOT NULL PRIMARY KEY,"
        " `host` VARCHAR(255) NOT NULL,"
        " `port` INT UNSIGNED NOT NULL,"
        " UNIQUE KEY `by_address` (`host`, `port`)"
    ),
    "replicas": (
        "`server_id` INT UNSIGNED NOT NULL,"
        " `host` VARCHAR(255) NOT NULL,"
        " `port` INT UNSIGNED NOT NULL,"
        " PRIMARY KEY (`server_id`, `host`, `port`)"
    ),
    "shards": ("`shard` INT UNSIGNED NOT NULL PRIMARY KEY, `server_id` INT UNSIGNED NOT NULL"),
    "indexes": (
        "`name` VARCHAR(64) NOT NULL PRIMARY KEY,"
        " `definition` TEXT NOT NULL,"
        " `state` VARCHAR(16) NOT NULL,"
        " `created` BIGINT UNSIGNED NOT NULL,"
        " `changed` BIGINT UNSIGNED NOT NULL"
    ),
    "checkpoints": (
        "`job` VARCHAR(128) NOT NULL,"
        " `shard` INT UNSIGNED NOT NULL,"
        " `position` BIGINT UNSIGNED NOT NULL,"
        " `done` TINYINT NOT NULL DEFAULT 0,"
        " `rows_done` BIGINT UNSIGNED NOT NULL DEFAULT 0,"
        " `cursor` BLOB NULL,"
        " `updated` BIGINT UNSIGNED NOT NULL,"
        " PRIMARY KEY (`job`, `shard`)"
    ),
    "dictionaries": (
        "`dict_id` INT UNSIGNED NOT NULL PRIMARY KEY,"
        " `data` MEDIUMBLOB NOT NULL,"
        " `created` BIGINT UNSIGNED NOT NULL"
    ),
    "moves": (
        "`shard` INT UNSIGNED NOT NULL PRIMARY KEY,"
        " `source` INT UNSIGNED NOT NULL,"
        " `target` INT UNSIGNED NOT NULL,"
        " `phase` VARCHAR(96) NOT NULL,"
        " `started` BIGINT UNSIGNED NOT NULL,"
        " `updated` BIGINT UNSIGNED NOT NULL"
    ),
    "status": (
        "`name` VARCHAR(128) NOT NULL PRIMARY KEY,"
        " `heartbeat` BIGINT UNSIGNED NOT NULL,"
        " `figures` TEXT NOT NULL"
    ),
    # each subscription's position in the change feed, per logical shard (schemaless.feed)
    "feed_positions": (
        "`name` VARCHAR(64) NOT NULL,"
        " `shard` INT UNSIGNED NOT NULL,"
        " `position` BIGINT UNSIGNED NOT NULL,"
        " `scan` BIGINT UNSIGNED NULL,"
        " `acked` BIGINT UNSIGNED NOT NULL,"
        " PRIMARY KEY (`name`, `shard`)"
    ),
    # writes that met a building index with values it cannot hold (Catalog.block_index):
    # the application user may write here, never to the Cleaner's checkpoints
    "blocks": (
        "`index_name` VARCHAR(64) NOT NULL PRIMARY KEY,"
        " `writes` BIGINT UNSIGNED NOT NULL,"
        " `examples` BLOB NOT NULL,"
        " `updated` BIGINT UNSIGNED NOT NULL"
    ),
    # index rows a backfill could not write yet: the entities of logical shard
    # ``source`` with added_id in (after_id, upto_id] may have rows for ``target``
    # (schemaless.deferrals)
    "deferrals": (
        "`index_name` VARCHAR(64) NOT NULL,"
        " `source` INT UNSIGNED NOT NULL,"
        " `target` INT UNSIGNED NOT NULL,"
        " `after_id` BIGINT UNSIGNED NOT NULL,"
        " `upto_id` BIGINT UNSIGNED NOT NULL,"
        " `updated` BIGINT UNSIGNED NOT NULL,"
        " PRIMARY KEY (`index_name`, `source`, `target`)"
    ),
    # each client's recent write latency per server (schemaless.latency)
    "clients": (
        "`name` VARCHAR(128) NOT NULL PRIMARY KEY,"
        " `heartbeat` BIGINT UNSIGNED NOT NULL,"
        " `latencies` TEXT NOT NULL"
    ),
}
