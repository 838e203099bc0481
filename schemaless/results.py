"""Result sets read by their shape: one verb per shape, as torndb has.

``Server.run`` returns the rows of every result set of a batch; :func:`scalar` and
:func:`one` say what the caller expects of one of them instead of ``[0][0][0]``,
and a result of another shape is a :class:`~schemaless.errors.ServerError` rather
than an ``IndexError`` or a value silently taken from the wrong row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import ServerError

__all__ = ["one", "scalar"]

Row = tuple[Any, ...]


def one(rows: Sequence[Row]) -> Row | None:
    """The only row of a result set, or None if it has none (more is an error)."""
    if len(rows) > 1:
        raise ServerError(f"expected at most one row, got {len(rows)}")
    return rows[0] if rows else None


def scalar(rows: Sequence[Row]) -> Any:
    """The first column of the only row of a result set (no row is an error)."""
    row = one(rows)
    if row is None:
        raise ServerError("expected one row, got none")
    return row[0]
