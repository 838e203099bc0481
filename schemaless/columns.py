"""Index column types: a small vocabulary (:func:`parse_type`) and the coercion of values.

Every value is *coerced* before it reaches SQL: the coerced value is the SQL parameter
and the value the query re-filter compares, so Python's comparison of coerced values
agrees with MariaDB's comparison of the column.  A value that does not fit its column is
refused, never truncated.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from .errors import IndexDefinitionError
from .keys import INT_MAX, INT_MIN, check_finite, key_encode, utf8

__all__ = ["AUTO", "ColumnType", "parse_type", "type_name"]

_Coercer = Callable[[object], object]

AUTO_MAX_BYTES = 767
STR_MAX = 768
BYTES_MAX = 3072


def type_name(value: object) -> str:
    return type(value).__name__


def _coerce_uuid(value: object) -> object:
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, bytes):
        if len(value) != 16:
            raise ValueError(f"expected 16 bytes for a uuid, got {len(value)} bytes")
        return bytes(value)
    raise ValueError(f"expected 16 bytes or uuid.UUID, got {type_name(value)}")


def _coerce_int(value: object) -> object:
    if type(value) is int:
        if not INT_MIN <= value <= INT_MAX:
            raise ValueError("int is outside the 64-bit signed range (-2**63 .. 2**63-1)")
        return value
    if isinstance(value, bool):
        raise ValueError("bool is not an int")
    if isinstance(value, int):
        return _coerce_int(int(value))
    raise ValueError(f"expected int, got {type_name(value)}")


def _coerce_float(value: object) -> object:
    if type(value) is float:
        check_finite(value)
        return value + 0.0  # normalises -0.0 to 0.0
    if isinstance(value, bool):
        raise ValueError("bool is not a float")
    if isinstance(value, int):
        try:
            f = float(value)
        except OverflowError:
            raise ValueError("int is too large for a float") from None
        if f != value:
            raise ValueError("int cannot be stored exactly as a float (above 2**53)")
        return f
    if isinstance(value, float):
        return _coerce_float(float(value))
    raise ValueError(f"expected float, got {type_name(value)}")


def _coerce_bool(value: object) -> object:
    if value is True:
        return 1
    if value is False:
        return 0
    raise ValueError(f"expected bool, got {type_name(value)}")


def _coerce_auto(value: object) -> object:
    try:
        encoded = key_encode(value)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if len(encoded) > AUTO_MAX_BYTES:
        raise ValueError(
            f"{type_name(value)} encodes to {len(encoded)} bytes, longer than the "
            f"{AUTO_MAX_BYTES} an untyped (auto) column holds; declare a typed str(N) "
            "property for longer values"
        )
    return encoded


def _str_coercer(n: int) -> _Coercer:
    def coerce(value: object) -> object:
        if type(value) is not str:
            if not isinstance(value, str):
                raise ValueError(f"expected str, got {type_name(value)}")
            value = str(value)
        if len(value) > n:
            raise ValueError(f"str of {len(value)} characters is longer than str({n})")
        if not value.isascii():
            utf8(value)
        return value

    return coerce


def _bytes_coercer(n: int) -> _Coercer:
    def coerce(value: object) -> object:
        if type(value) is not bytes:
            if not isinstance(value, bytes):
                raise ValueError(f"expected bytes, got {type_name(value)}")
            value = bytes(value)
        if len(value) > n:
            raise ValueError(f"bytes of {len(value)} bytes is longer than bytes({n})")
        return value

    return coerce


_CANONICAL = re.compile(r"(uuid|int|float|bool|auto)\Z|(str|bytes)\(([1-9][0-9]{0,4})\)\Z")


def _spec(name: str) -> tuple[str, int, _Coercer]:
    """(sql, key_bytes, coercer) for a canonical type name, or ValueError."""
    m = _CANONICAL.match(name)
    if m is None:
        raise ValueError(f"not a canonical column type name: {name!r}")
    simple = m.group(1)
    if simple == "uuid":
        return "BINARY(16)", 16, _coerce_uuid
    if simple == "int":
        return "BIGINT", 8, _coerce_int
    if simple == "float":
        return "DOUBLE", 8, _coerce_float
    if simple == "bool":
        return "TINYINT", 1, _coerce_bool
    if simple == "auto":
        return f"VARBINARY({AUTO_MAX_BYTES})", AUTO_MAX_BYTES, _coerce_auto
    kind, n = m.group(2), int(m.group(3))
    if kind == "str":
        if n > STR_MAX:
            raise ValueError(f"str(N) takes 1 <= N <= {STR_MAX}, got {n}")
        sql = f"VARCHAR({n}) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
        return sql, 4 * n, _str_coercer(n)
    if n > BYTES_MAX:
        raise ValueError(f"bytes(N) takes 1 <= N <= {BYTES_MAX}, got {n}")
    return f"VARBINARY({n})", n, _bytes_coercer(n)


@dataclass(frozen=True)
class ColumnType:
    """A declared index column type; build it with :func:`parse_type`."""

    name: str
    sql: str
    key_bytes: int
    _coerce: _Coercer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sql, key_bytes, coercer = _spec(self.name)
        if (sql, key_bytes) != (self.sql, self.key_bytes):
            raise ValueError(
                f"inconsistent ColumnType for {self.name!r}; use schemaless.index.parse_type()"
            )
        object.__setattr__(self, "_coerce", coercer)

    @property
    def is_auto(self) -> bool:
        """True for the untyped ``auto`` column (values are :func:`key_encode` bytes)."""
        return self.name == "auto"

    @property
    def plain(self) -> bool:
        """Whether a column value, stored as a property, gives itself back: not so for
        ``auto`` (key-encoded bytes) nor ``bool`` (0 and 1, from True and False only)."""
        return self.name not in ("auto", "bool")

    def coerce(self, value: object) -> object:
        """The column value for ``value``; ValueError (with the reason) if it does not fit."""
        return self._coerce(value)

    def tag_bounds(self, coerced: object) -> tuple[bytes, bytes] | None:
        """For ``auto``: ``(tag, tag + 1)``, bounds that keep a range within the value's
        type (``lo <= column < hi``); None for typed columns."""
        if self.name != "auto":
            return None
        if not isinstance(coerced, bytes) or not coerced:
            raise ValueError("expected a coerced (key-encoded) auto value")
        tag = coerced[0]
        return bytes((tag,)), bytes((tag + 1,))


_ALIASES = {"binary16": "uuid"}
_PARSE = re.compile(r"(uuid|int|float|bool|auto|binary16)\Z|(str|string|bytes)\(([0-9]{1,6})\)\Z")


@lru_cache(maxsize=256)
def _parse_cached(text: str) -> ColumnType:
    norm = "".join(text.split()).lower()
    m = _PARSE.match(norm)
    if m is None:
        raise IndexDefinitionError(
            f"unknown column type {text!r}: use uuid, str(N), bytes(N), int, float, bool or auto"
        )
    if m.group(1):
        name = _ALIASES.get(m.group(1), m.group(1))
    else:
        kind = "str" if m.group(2) in ("str", "string") else "bytes"
        n = int(m.group(3))
        limit = STR_MAX if kind == "str" else BYTES_MAX
        if not 1 <= n <= limit:
            raise IndexDefinitionError(
                f"bad column type {text!r}: {kind}(N) takes 1 <= N <= {limit}"
            )
        name = f"{kind}({n})"
    sql, key_bytes, _ = _spec(name)
    return ColumnType(name, sql, key_bytes)


def parse_type(text: str) -> ColumnType:
    """Parse a column type: ``uuid`` (alias ``binary16``), ``str(N)`` (alias
    ``string(N)``), ``bytes(N)``, ``int``, ``float``, ``bool``, ``auto``.

    Case-insensitive, spaces tolerated; IndexDefinitionError otherwise.
    """
    if not isinstance(text, str):
        raise IndexDefinitionError(f"a column type must be a str, got {type_name(text)}")
    return _parse_cached(text)


AUTO = parse_type("auto")
