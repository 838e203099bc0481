"""SQL identifiers: validated against an allow-list, then quoted.

Identifiers never come from unvalidated input: every database, table and column
name passes :func:`check_identifier` before :func:`quote` puts it into SQL.
"""

from __future__ import annotations

import functools
import re

from .errors import IndexDefinitionError

__all__ = ["check_identifier", "escape_wildcards", "quote"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


def check_identifier(name: object, what: str = "name") -> str:
    """Return ``name`` if it is a safe identifier, else raise IndexDefinitionError."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise IndexDefinitionError(
            f"invalid {what} {name!r}: use letters, digits and '_' (at most 64, "
            "not starting with a digit)"
        )
    return name


@functools.lru_cache(maxsize=65536)
def quote(*parts: str) -> str:
    """Quote a dotted identifier (``db``.``table``) after validating each part."""
    return ".".join(f"`{check_identifier(p)}`" for p in parts)


def escape_wildcards(name: str) -> str:
    """A validated name with its ``_`` escaped, for a ``LIKE`` pattern or a
    database-level GRANT, where ``_`` is a wildcard (``%``, the other one, cannot be in
    a validated name)."""
    return check_identifier(name).replace("_", "\\_")
