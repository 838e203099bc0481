"""A batch on the wire: its parameters as SQL literals, and every result set read.

The driver's own ``execute`` is bypassed (one ``send_query`` of the whole batch), so
these two helpers are all the driver's statement API the library uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import MySQLdb

__all__ = ["close_quietly", "literals", "read_results"]


def literals(db: Any, params: Sequence[Any]) -> tuple[bytes, ...]:
    """SQL literals of the parameters: the driver's escaping, with a fast path for the
    types every statement is full of (bytes, int, str)."""
    quote = db.string_literal
    out = []
    for value in params:
        kind = type(value)
        if kind is bytes:
            out.append(quote(value))
        elif kind is int:
            out.append(b"%d" % value)
        elif kind is str:
            out.append(quote(value.encode()))
        elif value is None:
            out.append(b"NULL")
        else:
            out.append(db.literal(value))
    return tuple(out)


def read_results(db: Any, counts: list[int] | None) -> list[tuple[tuple[Any, ...], ...]]:
    """Every result set of the batch just sent (and, into ``counts``, the affected rows
    of each statement that has no result set).

    The driver's result objects are freed when this function returns, while the
    calling thread still owns the connection (freeing one takes the connection's lock).
    """
    results = []
    while True:
        result = db.store_result()
        if result is not None:
            results.append(result.fetch_row(maxrows=0))
        elif counts is not None:
            counts.append(db.affected_rows())
        if db.next_result() != 0:
            return results


def close_quietly(db: Any) -> None:
    with contextlib.suppress(MySQLdb.Error):  # already broken: nothing more to release
        db.close()
