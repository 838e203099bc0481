"""The error hierarchy: one root, retryable failures apart from permanent ones.

The retryable ones share :class:`TransientError`, which promises nothing about what
was committed; :class:`ShardUnavailable` (nothing was) and :class:`OutcomeUnknown`
(it may have been) are siblings under it, so a handler of the first never mistakes
the second for it.

Every driver error is translated into one of these in ``schemaless.translate``;
the original is kept as ``__cause__``.  Messages say what was wrong and where, and
never contain credentials.
"""

from __future__ import annotations

__all__ = [
    "CatalogError",
    "CatalogUnavailable",
    "ConflictError",
    "CorruptEntity",
    "DataStoreClosed",
    "EntityTooLarge",
    "IndexDefinitionError",
    "IndexDoesNotFit",
    "IndexNotReady",
    "InvalidCursor",
    "InvalidEntity",
    "InvalidId",
    "InvalidQuery",
    "LocalClusterError",
    "OutcomeUnknown",
    "PermissionDenied",
    "SchemalessError",
    "ServerError",
    "ShardTimeout",
    "ShardUnavailable",
    "StorageFull",
    "TableMissing",
    "TransientError",
    "UniqueViolation",
]


class SchemalessError(Exception):
    """Root of every error raised by schemaless."""

    #: True when the same call may succeed if simply made again later.
    retryable: bool = False


# -- permanent: the caller's input or the stored data is wrong -----------------------


class InvalidId(SchemalessError, ValueError):
    """An entity id that is not 16 bytes (``bytes`` or ``uuid.UUID``)."""


class InvalidEntity(SchemalessError, ValueError):
    """An entity the codec or an index cannot store as given; nothing was written."""


class EntityTooLarge(InvalidEntity):
    """An encoded body above the size limit or the server's max_allowed_packet."""


class IndexDefinitionError(SchemalessError, ValueError):
    """A bad or conflicting index definition (name, property, type)."""


class IndexDoesNotFit(IndexDefinitionError):
    """A new index that the stored entities do not fit: values that do not fit its
    column types, or (unique) values that repeat; declare it with ``force`` anyway.
    ``summary``: the counts in one line; ``examples``: a line per example entity."""

    def __init__(self, summary: str, examples: list[str]) -> None:
        super().__init__("\n".join([summary, *examples]))
        self.summary = summary
        self.examples = examples


class InvalidQuery(SchemalessError, ValueError):
    """A query that the index cannot answer, or a bad cursor."""


class InvalidCursor(InvalidQuery):
    """A query's cursor that is not one, or is another query's."""


class IndexNotReady(SchemalessError):
    """A query on an index that is still building (or dropped) without opting in."""


class ConflictError(SchemalessError):
    """An optimistic-concurrency check failed: the entity changed since it was read."""

    def __init__(self, message: str, *, current_version: int | None = None) -> None:
        super().__init__(message)
        self.current_version = current_version


class UniqueViolation(ConflictError):
    """A put would produce a value of a unique index that another live entity owns;
    nothing of the entity was written.  ``index`` and ``values`` (the index's values, in
    property order) name the value; the other entity is not named."""

    def __init__(self, message: str, *, index: str, values: tuple[object, ...]) -> None:
        super().__init__(message)
        self.index = index
        self.values = values


class DataStoreClosed(SchemalessError):
    """A call on a datastore after its ``close()``: a programming error, never retried."""


class CorruptEntity(SchemalessError):
    """A stored body that cannot be decoded (corrupt, truncated, unknown format)."""


class CatalogError(SchemalessError):
    """The catalog is missing, inconsistent, or refuses a change."""


class TableMissing(CatalogError):
    """A shard database or table is not where the map says: the datastore is not
    initialised there, or the logical shard is moving (retried while a move runs)."""


class PermissionDenied(SchemalessError):
    """The database user lacks a privilege the operation needs."""


class ServerError(SchemalessError):
    """Any other error reported by a server."""


class StorageFull(ServerError):
    """A server ran out of space (disk full, or a data file at its size cap): the
    statement failed and its transaction was rolled back.  Free space, then retry."""


# -- transient: the same call may succeed later --------------------------------------


class TransientError(SchemalessError):
    """A server could not be reached, did not answer, or was lost during the call: the
    same call may succeed later.  Whether anything was committed depends on the
    subclass: nothing for :class:`ShardUnavailable`, perhaps for :class:`OutcomeUnknown`."""

    retryable = True


class ShardUnavailable(TransientError):
    """A server could not be reached or stopped answering; nothing was committed."""


class ShardTimeout(ShardUnavailable):
    """A server did not answer within the configured timeout."""


class CatalogUnavailable(ShardUnavailable):
    """Opening a datastore could not read its catalog: the catalog's server (the first
    of ``mysql_shards``) is down or does not answer."""


class OutcomeUnknown(TransientError):
    """The connection was lost after a commit was sent: the write may or may not have
    happened.  Read the entity back, or retry with the same ``expect_version``.  Not a
    :class:`ShardUnavailable`: that one promises nothing was committed."""


# -- development tooling ----------------------------------------------------------------


class LocalClusterError(SchemalessError):
    """The local cluster (:mod:`schemaless.local`) could not be set up, started or
    stopped."""
