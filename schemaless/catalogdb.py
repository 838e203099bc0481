"""The catalog database on its server: what every part of ``Catalog`` builds on.

Table names, the map lock, the two clocks catalog rows are stamped with, the
datastore's named locks, and the names of the Cleaner's checkpoint jobs (the index
lifecycle and the checkpoints both read and clear those rows).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from .connection import Server
from .errors import CatalogError
from .names import quote
from .results import scalar
from .schema import check_prefix

__all__ = [
    "SERVER_US",
    "CatalogDB",
    "backfill_job",
    "now_us",
    "sweep_job",
    "unfit_job",
    "unique_job",
]

#: The catalog server's clock in microseconds: index state changes are stamped with
#: it, and the Cleaner's grace period is measured on it, so client clocks may differ.
SERVER_US = "(UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6)))"  # one instant, no time zone


def now_us() -> int:
    """Wall-clock microseconds since the epoch."""
    return time.time_ns() // 1000


def backfill_job(index: str) -> str:
    """The checkpoint job of an index's backfill."""
    return f"backfill:{index}"


def sweep_job(index: str) -> str:
    """The checkpoint job of an index's sweep (a cursor per shard)."""
    return f"sweep:{index}"


def unfit_job(index: str) -> str:
    """The checkpoint rows of the entities a backfill set aside because their values
    do not fit the index, per scanned logical shard (as ``unique_job``)."""
    return f"unfit:{index}"


def unique_job(index: str) -> str:
    """The checkpoint rows of a unique index's duplicates, per scanned logical shard
    (``rows_done``: how many were found; ``cursor``: a JSON list of some of them)."""
    return f"unique:{index}"


class CatalogDB:
    """The catalog database (``<prefix>_catalog``) through its server."""

    def __init__(self, server: Server, prefix: str) -> None:
        self.server = server
        self.prefix = check_prefix(prefix)
        self.db = f"{prefix}_catalog"

    def _t(self, table: str) -> str:
        return quote(self.db, table)

    @property
    def _lock_map(self) -> str:
        """Lock the map version's row until the transaction ends: the declaration of an
        index and the flip of a shard move take it, so they never interleave."""
        return f"SELECT value FROM {self._t('meta')} WHERE name = 'map_version' FOR UPDATE"

    def server_now_us(self) -> int:
        """The catalog server's clock, in microseconds since the epoch."""
        return int(scalar(self.server.run(f"SELECT {SERVER_US}")[0]))

    @contextmanager
    def lock(self, name: str, busy: str, wait: float) -> Iterator[None]:
        """Hold the named lock ``name`` of this datastore, so that one process at a time
        does what it guards; ``CatalogError(busy)`` after ``wait`` seconds.  A named lock
        on the catalog server: the server also releases it when the holder's connection
        ends, so a process that dies frees it.  Driver errors are translated (by
        ``Server.connection``)."""
        full = f"schemaless:{self.prefix}:{name}".encode()
        if len(full) > 64:  # the server's limit for a lock name
            full = b"schemaless:" + hashlib.blake2b(full, digest_size=16).hexdigest().encode()
        wait = min(wait, self.server.options.read_timeout - 2)  # an answer, not a timeout
        with self.server.connection() as db:
            lock = db.string_literal(full)
            db.query(b"SELECT GET_LOCK(%s, %d), IS_USED_LOCK(%s)" % (lock, max(0, wait), lock))
            got, holder = db.store_result().fetch_row()[0]
            if got != 1:
                raise CatalogError(f"{busy} (catalog connection {holder}); try again later")
            try:
                yield
            finally:
                with suppress(Exception):  # a connection lost meanwhile took it along
                    db.query(b"DO RELEASE_LOCK(%s)" % lock)
