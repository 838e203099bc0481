"""Index definitions: typed columns, the rows an entity produces, and the DDL.

An index is a table ``index_<name>`` on every logical shard, with one column
``p_<property>`` per indexed property, then ``entity_id`` and ``entity_version``.
Its rows are placed by the value of the ``shard_on`` property.

Column types come from a small vocabulary (:func:`parse_type`).  Every value is
*coerced* before it reaches SQL: the coerced value is the SQL parameter and the value
the query re-filter compares, so Python's comparison of coerced values agrees with
MariaDB's comparison of the column.  A value that does not fit its column is refused,
never truncated.

:func:`key_encode` is the canonical, order-preserving encoding of a scalar: it is the
column value of untyped (``auto``) properties and the bytes hashed for placement.
"""

from __future__ import annotations

import math
import re
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

from .errors import IndexDefinitionError, InvalidEntity, InvalidQuery
from .names import check_identifier, quote

if TYPE_CHECKING:
    from .entity import Entity
    from .store import DataStore

__all__ = ["ColumnType", "Index", "key_decode", "key_encode", "parse_type"]

# -- key_encode ------------------------------------------------------------------------

TAG_BOOL = b"\x01"
TAG_INT = b"\x02"
TAG_FLOAT = b"\x03"
TAG_STR = b"\x04"
TAG_BYTES = b"\x05"

_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1
_INT_BIAS = 2**63
_SIGN_BIT = 1 << 63
_ALL_BITS = (1 << 64) - 1
_pack_double = struct.Struct(">d").pack
_pack_int = partial(struct.Struct(">BQ").pack, TAG_INT[0])  # tag and biased value
_unpack_u64 = struct.Struct(">Q").unpack


def _encode_int(value: int) -> bytes:
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError("int is outside the 64-bit signed range (-2**63 .. 2**63-1)")
    return _pack_int(value + _INT_BIAS)  # one call: the backfill places every row with it


def _check_finite(value: float) -> None:
    if value != value:
        raise ValueError("NaN cannot be indexed")
    if value in (math.inf, -math.inf):
        raise ValueError(f"{value} cannot be indexed")


def _encode_float(value: float) -> bytes:
    _check_finite(value)
    if value == 0.0:
        value = 0.0  # -0.0 and 0.0 are the same key
    bits: int = _unpack_u64(_pack_double(value))[0]
    bits = bits ^ _ALL_BITS if bits & _SIGN_BIT else bits | _SIGN_BIT
    return TAG_FLOAT + bits.to_bytes(8, "big")


def _utf8(value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("str contains a lone surrogate (not valid UTF-8)") from None


def key_encode(value: object) -> bytes:
    """The canonical, order-preserving bytes of a scalar (tag byte, then payload).

    Within one type, bytewise order of encodings equals Python's order of values.
    A ``uuid.UUID`` encodes as its 16 bytes.  Raises TypeError for an unsupported
    type and ValueError for an unsupported value (NaN, inf, out-of-range int, lone
    surrogate).
    """
    t = type(value)
    if t is str:
        return TAG_STR + _utf8(value)  # type: ignore[arg-type]
    if t is int:
        return _encode_int(value)  # type: ignore[arg-type]
    if t is bytes:
        return TAG_BYTES + value  # type: ignore[operator]
    if t is bool:
        return TAG_BOOL + (b"\x01" if value else b"\x00")
    if t is float:
        return _encode_float(value)  # type: ignore[arg-type]
    # subclasses (IntEnum, str enums, ...) and uuid.UUID
    if isinstance(value, bool):
        return TAG_BOOL + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return _encode_int(int(value))
    if isinstance(value, float):
        return _encode_float(float(value))
    if isinstance(value, str):
        return TAG_STR + _utf8(str(value))
    if isinstance(value, bytes):
        return TAG_BYTES + bytes(value)
    if isinstance(value, uuid.UUID):
        return TAG_BYTES + value.bytes
    raise TypeError(f"a {t.__name__} cannot be indexed (use str, bytes, int, float, bool, UUID)")


_unpack_double = struct.Struct(">d").unpack


def key_decode(encoded: bytes) -> object:
    """The scalar of :func:`key_encode` bytes (a UUID comes back as its 16 bytes)."""
    tag, payload = encoded[:1], bytes(encoded[1:])
    if tag == TAG_STR:
        return payload.decode("utf-8")
    if tag == TAG_BYTES:
        return payload
    if tag == TAG_BOOL:
        return payload == b"\x01"
    bits = int.from_bytes(payload, "big")
    if tag == TAG_INT:
        return bits - _INT_BIAS
    if tag == TAG_FLOAT:
        bits = bits ^ _SIGN_BIT if bits & _SIGN_BIT else bits ^ _ALL_BITS
        return float(_unpack_double(bits.to_bytes(8, "big"))[0])
    raise ValueError(f"not a key_encode value: tag {tag!r}")


# -- column types ----------------------------------------------------------------------

_Coercer = Callable[[object], object]

AUTO_MAX_BYTES = 767
STR_MAX = 768
BYTES_MAX = 3072
MAX_KEY_BYTES = 3072
ENTITY_ID_BYTES = 16


def _type_name(value: object) -> str:
    return type(value).__name__


def _coerce_uuid(value: object) -> object:
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, bytes):
        if len(value) != 16:
            raise ValueError(f"expected 16 bytes for a uuid, got {len(value)} bytes")
        return bytes(value)
    raise ValueError(f"expected 16 bytes or uuid.UUID, got {_type_name(value)}")


def _coerce_int(value: object) -> object:
    if type(value) is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueError("int is outside the 64-bit signed range (-2**63 .. 2**63-1)")
        return value
    if isinstance(value, bool):
        raise ValueError("bool is not an int")
    if isinstance(value, int):
        return _coerce_int(int(value))
    raise ValueError(f"expected int, got {_type_name(value)}")


def _coerce_float(value: object) -> object:
    if type(value) is float:
        _check_finite(value)
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
    raise ValueError(f"expected float, got {_type_name(value)}")


def _coerce_bool(value: object) -> object:
    if value is True:
        return 1
    if value is False:
        return 0
    raise ValueError(f"expected bool, got {_type_name(value)}")


def _coerce_auto(value: object) -> object:
    try:
        encoded = key_encode(value)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if len(encoded) > AUTO_MAX_BYTES:
        raise ValueError(
            f"{_type_name(value)} encodes to {len(encoded)} bytes, longer than the "
            f"{AUTO_MAX_BYTES} an untyped (auto) column holds; declare a typed str(N) "
            "property for longer values"
        )
    return encoded


def _str_coercer(n: int) -> _Coercer:
    def coerce(value: object) -> object:
        if type(value) is not str:
            if not isinstance(value, str):
                raise ValueError(f"expected str, got {_type_name(value)}")
            value = str(value)
        if len(value) > n:
            raise ValueError(f"str of {len(value)} characters is longer than str({n})")
        if not value.isascii():
            _utf8(value)
        return value

    return coerce


def _bytes_coercer(n: int) -> _Coercer:
    def coerce(value: object) -> object:
        if type(value) is not bytes:
            if not isinstance(value, bytes):
                raise ValueError(f"expected bytes, got {_type_name(value)}")
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
        raise IndexDefinitionError(f"a column type must be a str, got {_type_name(text)}")
    return _parse_cached(text)


AUTO = parse_type("auto")

# -- Index -----------------------------------------------------------------------------

_INDEX_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}\Z")
MAX_PROPERTIES = 8
_COLUMN_PREFIX = "p_"


def _check_index_name(name: object) -> str:
    if not isinstance(name, str) or not _INDEX_NAME.match(name):
        raise IndexDefinitionError(
            f"invalid index name {name!r}: use 1 to 48 lowercase letters, digits and '_', "
            "starting with a letter"
        )
    return name


def _resolve_name(name: str | None, table: str | None) -> str:
    if table is not None:
        if not isinstance(table, str) or not table.startswith("index_"):
            raise IndexDefinitionError(
                f"invalid index table {table!r}: it must start with 'index_'"
            )
        from_table = _check_index_name(table[len("index_") :])
        if name is not None and name != from_table:
            raise IndexDefinitionError(
                f"index name {name!r} and table {table!r} disagree (the table is 'index_<name>')"
            )
        return from_table
    if name is None:
        raise IndexDefinitionError("an index needs a name (or a table='index_<name>')")
    return _check_index_name(name)


def _typed_properties(
    where: str, specs: Sequence[tuple[Any, Any]]
) -> tuple[list[str], list[ColumnType]]:
    """An index's property names, checked, and their column types."""
    props: list[str] = []
    types: list[ColumnType] = []
    seen: dict[str, str] = {}
    for raw_prop, type_text in specs:
        try:
            prop = check_identifier(raw_prop, what="property name")
        except IndexDefinitionError as exc:
            raise IndexDefinitionError(f"{where}: {exc}") from None
        if len(_COLUMN_PREFIX + prop) > 64:
            raise IndexDefinitionError(
                f"property name {prop!r} in {where} is too long (at most 62 characters)"
            )
        folded = prop.lower()
        if folded in seen:
            raise IndexDefinitionError(
                f"{where} lists property {prop!r} twice"
                if seen[folded] == prop
                else f"{where}: properties {seen[folded]!r} and {prop!r} differ only in "
                "case (column names are case-insensitive)"
            )
        seen[folded] = prop
        if type_text is None:
            ctype = AUTO
        elif isinstance(type_text, ColumnType):
            ctype = type_text
        elif isinstance(type_text, str):
            try:
                ctype = parse_type(type_text)
            except IndexDefinitionError as exc:
                raise IndexDefinitionError(f"property {prop!r} of {where}: {exc}") from None
        else:
            raise IndexDefinitionError(
                f"property {prop!r} of {where}: a type must be a str, got {_type_name(type_text)}"
            )
        props.append(prop)
        types.append(ctype)
    return props, types


def _check_key_size(where: str, props: Sequence[str], types: Sequence[ColumnType]) -> None:
    """Refuse an index whose key InnoDB would refuse."""
    key_bytes = sum(t.key_bytes for t in types) + ENTITY_ID_BYTES
    if key_bytes > MAX_KEY_BYTES:
        detail = ", ".join(f"{p}:{t.name}={t.key_bytes}" for p, t in zip(props, types, strict=True))
        raise IndexDefinitionError(
            f"{where}: the key is {key_bytes} bytes ({detail}, entity_id=16), above "
            f"InnoDB's {MAX_KEY_BYTES}; declare shorter str(N)/bytes(N) types "
            "(an untyped property takes 767)"
        )


def _property_specs(
    properties: Sequence[str | tuple[str, str] | list[str]] | Mapping[str, str],
) -> list[tuple[object, object]]:
    if isinstance(properties, Mapping):
        return list(properties.items())
    if isinstance(properties, (str, bytes)) or not isinstance(properties, Iterable):
        raise IndexDefinitionError(
            f"properties must be a list of names (or a dict name -> type), "
            f"got {_type_name(properties)}"
        )
    specs: list[tuple[object, object]] = []
    for item in properties:
        if isinstance(item, str):
            if ":" in item:
                prop, _, type_text = item.partition(":")
                specs.append((prop.strip(), type_text))
            else:
                specs.append((item, "auto"))
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            specs.append((item[0], item[1]))
        else:
            raise IndexDefinitionError(
                f"bad property {item!r}: use 'name', 'name:type' or (name, type)"
            )
    return specs


class Index:
    """An index definition (immutable).

    ``Index(table="index_user_id", properties=["user_id"], shard_on="user_id")`` (the
    FriendFeed form) and ``Index("by_user", {"user_id": "uuid", "published": "int"})``
    define the same kind of object; untyped properties are ``auto``.  ``unique=True``:
    at most one live entity produces a given tuple of values (``UniqueViolation``).
    """

    __slots__ = (
        "_coercers",
        "_key",
        "_pairs",
        "_pos",
        "columns",
        "multi",
        "multi_pos",
        "name",
        "properties",
        "shard_on",
        "shard_pos",
        "table",
        "types",
        "unique",
    )

    name: str
    table: str
    properties: tuple[str, ...]
    types: tuple[ColumnType, ...]
    columns: tuple[str, ...]
    shard_on: str
    shard_pos: int
    multi: str | None
    multi_pos: int | None
    unique: bool

    def __init__(
        self,
        name: str | None = None,
        properties: Sequence[str | tuple[str, str] | list[str]] | Mapping[str, str] = (),
        shard_on: str | None = None,
        *,
        table: str | None = None,
        multi: str | None = None,
        unique: bool = False,
    ) -> None:
        self.name = _resolve_name(name, table)
        self.table = "index_" + self.name
        where = f"index {self.name!r}"

        specs = _property_specs(properties)
        if not 1 <= len(specs) <= MAX_PROPERTIES:
            raise IndexDefinitionError(
                f"{where} needs 1 to {MAX_PROPERTIES} properties, got {len(specs)}"
            )
        props, types = _typed_properties(where, specs)

        self.properties = tuple(props)
        self.types = tuple(types)
        self.columns = tuple(_COLUMN_PREFIX + p for p in props)
        self._pos = {p: i for i, p in enumerate(props)}
        listed = ", ".join(props)

        if shard_on is None:
            shard_on = props[0]
        if not isinstance(shard_on, str) or shard_on not in self._pos:
            raise IndexDefinitionError(
                f"shard_on {shard_on!r} of {where} must be one of its properties ({listed})"
            )
        self.shard_on = shard_on
        self.shard_pos = self._pos[shard_on]

        if multi is not None and (not isinstance(multi, str) or multi not in self._pos):
            raise IndexDefinitionError(
                f"multi {multi!r} of {where} must be one of its properties ({listed})"
            )
        self.multi = multi
        self.multi_pos = None if multi is None else self._pos[multi]
        if not isinstance(unique, bool):
            raise IndexDefinitionError(f"unique of {where} must be True or False, got {unique!r}")
        self.unique = unique

        _check_key_size(where, props, types)

        self._coercers = tuple(t._coerce for t in types)
        self._pairs = tuple(zip(self.properties, self._coercers, strict=True))
        self._key = (
            self.name,
            self.properties,
            tuple(t.name for t in types),
            shard_on,
            multi,
            unique,
        )

    # -- rows --------------------------------------------------------------------------

    def rows(self, entity: Mapping[str, Any]) -> set[tuple[Any, ...]]:
        """The index rows (coerced column values, in property order) ``entity`` produces.

        No rows when an indexed property is absent or None (or the multi list is
        empty).  InvalidEntity when a value does not fit its column.
        """
        get = entity.get
        if self.multi_pos is None:
            row = []
            for prop, coerce in self._pairs:
                value = get(prop)
                if value is None:
                    return set()
                try:
                    row.append(coerce(value))
                except ValueError as exc:
                    raise self._bad_value(prop, value, exc) from None
            return {tuple(row)}

        multi_pos = self.multi_pos
        values: list[Any] = []
        elements: set[Any] = set()
        for i, (prop, coerce) in enumerate(self._pairs):
            value = get(prop)
            if value is None:
                return set()
            if i != multi_pos:
                try:
                    values.append(coerce(value))
                except ValueError as exc:
                    raise self._bad_value(prop, value, exc) from None
                continue
            if not isinstance(value, (list, tuple)):
                raise InvalidEntity(
                    f"property {prop!r} of index {self.name!r} must be a list, "
                    f"got {_type_name(value)}"
                )
            for element in value:
                if element is None:
                    continue
                try:
                    elements.add(coerce(element))
                except ValueError as exc:
                    raise InvalidEntity(
                        f"an element of property {prop!r} of index {self.name!r} "
                        f"cannot be indexed: {exc}"
                    ) from None
            if not elements:
                return set()
            values.append(None)
        head, tail = values[:multi_pos], values[multi_pos + 1 :]
        return {(*head, element, *tail) for element in elements}

    def value(self, entity: Mapping[str, Any]) -> Any:
        """For an index of one column, not multi-valued: the value of the one row that
        ``rows`` gives (None: no row), without building the row (the backfill's hot
        path).  InvalidEntity when it does not fit the column."""
        prop = self.properties[0]
        value = entity.get(prop)
        if value is None:
            return None
        try:
            return self._coercers[0](value)
        except ValueError as exc:
            raise self._bad_value(prop, value, exc) from None

    def _bad_value(self, prop: str, value: object, exc: ValueError) -> InvalidEntity:
        if isinstance(value, (list, tuple)):
            return InvalidEntity(
                f"property {prop!r} of index {self.name!r} is a list, but the index is "
                "not multi-valued on it"
            )
        return InvalidEntity(f"property {prop!r} of index {self.name!r} cannot be indexed: {exc}")

    def coerce_query_value(self, prop: str, value: object) -> object:
        """The column value to query ``prop`` with (a scalar element for the multi
        property); InvalidQuery if the property is unknown or the value does not fit."""
        pos = self._pos.get(prop)
        if pos is None:
            raise InvalidQuery(
                f"index {self.name!r} has no property {prop!r}; "
                f"its properties are {', '.join(self.properties)}"
            )
        if value is None:
            raise InvalidQuery(
                f"cannot query property {prop!r} of index {self.name!r} with None "
                "(entities without the property are not indexed)"
            )
        if isinstance(value, (list, tuple)):
            raise InvalidQuery(
                f"cannot query property {prop!r} of index {self.name!r} with a "
                f"{_type_name(value)}; give a single value"
            )
        try:
            return self._coercers[pos](value)
        except ValueError as exc:
            raise InvalidQuery(
                f"bad value for property {prop!r} of index {self.name!r}: {exc}"
            ) from None

    def readable(self, values: Sequence[Any]) -> dict[str, Any]:
        """A row's values by property, as the entity had them (``auto`` columns
        decoded, ``bool`` columns as True/False): for messages and reports."""
        out: dict[str, Any] = {}
        for prop, ctype, value in zip(self.properties, self.types, values, strict=True):
            if ctype.is_auto and isinstance(value, bytes):
                value = key_decode(value)
            elif ctype.name == "bool":
                value = bool(value)
            out[prop] = value
        return out

    def shard_key(self, row: tuple[Any, ...]) -> bytes:
        """The canonical bytes that place ``row``: key_encode of its shard_on value."""
        return key_encode(row[self.shard_pos])

    # -- DDL, serialisation ------------------------------------------------------------

    def create_table_sql(self, database: str, *, entity_key: bool = True) -> str:
        """``CREATE TABLE IF NOT EXISTS`` for this index in ``database`` (without
        ``KEY by_entity`` unless ``entity_key``: a new index gets it when its backfill
        ends, ``entity_key_sql``)."""
        cols = [
            f"{quote(c)} {t.sql} NOT NULL" for c, t in zip(self.columns, self.types, strict=True)
        ]
        cols.append("`entity_id` BINARY(16) NOT NULL")
        cols.append("`entity_version` BIGINT UNSIGNED NOT NULL")
        # unique: one row per value, naming its owner (docs/architecture.md)
        key = [quote(c) for c in self.columns]
        pk = ", ".join(key if self.unique else [*key, "`entity_id`"])
        cols.append(f"PRIMARY KEY ({pk})")
        if entity_key:
            cols.append("KEY `by_entity` (`entity_id`)")
        body = ",\n  ".join(cols)
        return (
            f"CREATE TABLE IF NOT EXISTS {quote(database, self.table)} (\n  {body}\n) "
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin"
        )

    def entity_key_sql(self, database: str) -> str:
        """Add ``KEY by_entity`` to this index's table in ``database`` unless it has it,
        with InnoDB's sorted build, writers going on meanwhile (docs/architecture.md,
        "The ``by_entity`` key is built last")."""
        return (
            f"CREATE INDEX IF NOT EXISTS `by_entity` ON {quote(database, self.table)}"
            " (`entity_id`) ALGORITHM=INPLACE LOCK=NONE"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable definition (see :meth:`from_dict`); ``unique`` only when
        set, so a catalog written before unique indexes reads the same."""
        out: dict[str, Any] = {
            "name": self.name,
            "properties": [[p, t.name] for p, t in zip(self.properties, self.types, strict=True)],
            "shard_on": self.shard_on,
            "multi": self.multi,
        }
        if self.unique:
            out["unique"] = True
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Index:
        """Rebuild an index from :meth:`to_dict` output; IndexDefinitionError if malformed."""
        if not isinstance(d, Mapping):
            raise IndexDefinitionError(f"an index definition must be a dict, got {_type_name(d)}")
        unknown = set(d) - {"name", "properties", "shard_on", "multi", "unique"}
        if unknown or "name" not in d or "properties" not in d:
            raise IndexDefinitionError(
                f"malformed index definition (keys {sorted(map(str, d))}): expected "
                "name, properties, shard_on, multi, unique"
            )
        properties = d["properties"]
        if not isinstance(properties, (list, tuple)):
            raise IndexDefinitionError("malformed index definition: properties must be a list")
        return cls(
            d["name"],
            properties,
            d.get("shard_on"),
            multi=d.get("multi"),
            unique=d.get("unique", False),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Index):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        props = [f"{p}:{t.name}" for p, t in zip(self.properties, self.types, strict=True)]
        extra = f", multi={self.multi!r}" if self.multi is not None else ""
        extra += ", unique=True" if self.unique else ""
        return f"Index({self.name!r}, {props!r}, shard_on={self.shard_on!r}{extra})"

    # -- FriendFeed-style query --------------------------------------------------------

    def get_all(self, datastore: DataStore, **conditions: Any) -> list[Entity]:
        """Every entity matching ``conditions`` through this index (the FriendFeed form:
        ``index.get_all(datastore, user_id=...)``)."""
        return list(datastore.iter(self, where=conditions))

    def get(self, datastore: DataStore, **values: Any) -> Entity | None:
        """The one entity of a unique index with these values, or None (the FriendFeed
        form of ``datastore.get_by(index, ...)``)."""
        return datastore.get_by(self, **values)
