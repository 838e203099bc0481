"""Index definitions: the rows an entity produces, and the DDL of their tables.

An index is a table ``index_<name>`` on every logical shard, with one column
``p_<property>`` per indexed property, then ``entity_id`` and ``entity_version``.
Its rows are placed by the value of the ``shard_on`` property.  The column types are
``schemaless.columns``; the encoding of untyped values and of placement keys is
``schemaless.keys`` (both re-exported here).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .columns import AUTO, ColumnType, parse_type, type_name
from .errors import IndexDefinitionError, InvalidEntity, InvalidQuery
from .keys import key_decode, key_encode
from .names import check_identifier, quote

if TYPE_CHECKING:
    from .entity import Entity
    from .store import DataStore

__all__ = ["ColumnType", "Index", "key_decode", "key_encode", "parse_type"]

MAX_KEY_BYTES = 3072
ENTITY_ID_BYTES = 16
_INDEX_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}\Z")
MAX_PROPERTIES = 8
_COLUMN_PREFIX = "p_"


def _column(path: Sequence[str]) -> str:
    """The column of a property path: ``p_`` then its segments joined by ``__``."""
    return _COLUMN_PREFIX + "__".join(path)


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


def _check_path(where: str, raw: object) -> tuple[str, ...]:
    """A property's path segments: ``author.id`` is ``("author", "id")``, each segment a
    checked identifier (IndexDefinitionError naming the path and the bad part)."""
    if isinstance(raw, str) and "." in raw:
        for seg in raw.split("."):
            if not seg:
                raise IndexDefinitionError(
                    f"{where}: property path {raw!r} has an empty segment "
                    "(a leading, trailing or doubled '.')"
                )
            try:
                check_identifier(seg)
            except IndexDefinitionError:
                raise IndexDefinitionError(
                    f"{where}: segment {seg!r} of property path {raw!r} is not a name "
                    "(letters, digits and '_', not starting with a digit)"
                ) from None
        return tuple(raw.split("."))
    try:
        return (check_identifier(raw, what="property name"),)
    except IndexDefinitionError as exc:
        raise IndexDefinitionError(f"{where}: {exc}") from None


def _typed_properties(
    where: str, specs: Sequence[tuple[Any, Any]]
) -> tuple[list[str], list[ColumnType]]:
    """An index's property names (or dotted paths), checked, and their column types."""
    props: list[str] = []
    types: list[ColumnType] = []
    seen: dict[str, str] = {}
    for raw_prop, type_text in specs:
        path = _check_path(where, raw_prop)
        prop = ".".join(path)
        column = _column(path)
        if len(column) > 64:
            raise IndexDefinitionError(
                f"property {prop!r} in {where} is too long (its column {column!r} "
                "would be above 64 characters)"
            )
        folded = column.lower()
        if folded in seen:
            other = seen[folded]
            raise IndexDefinitionError(
                f"{where} lists property {prop!r} twice"
                if other == prop
                else f"{where}: properties {other!r} and {prop!r} differ only in "
                "case (column names are case-insensitive)"
                if other.lower() == prop.lower()
                else f"{where}: properties {other!r} and {prop!r} would share the column "
                f"{column!r} (a path's '.' becomes '__')"
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
                f"property {prop!r} of {where}: a type must be a str, got {type_name(type_text)}"
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
            f"got {type_name(properties)}"
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


_FILTER_TYPES = (str, int, float, bool)


def _follow(entity: Mapping[str, Any], path: Sequence[str]) -> Any:
    """The value at ``path`` (None when a step is missing or not a dict)."""
    value: Any = entity
    for seg in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(seg)
    return value


def _filter(where: str, spec: object, index: Index) -> tuple[tuple[str, tuple[str, ...], Any], ...]:
    """A partial index's filter ``{property or path: value}``, checked: each value a
    str, int, float or bool, and one that fits its column when the index uses the
    property too (never the multi one: a list never equals a value)."""
    if spec is None:
        return ()
    if not isinstance(spec, Mapping) or not spec:
        raise IndexDefinitionError(
            f"where of {where} must be a non-empty dict property -> value, got {spec!r}"
        )
    out = []
    for raw, value in sorted(spec.items(), key=lambda kv: str(kv[0])):
        path = _check_path(f"where of {where}", raw)
        prop = ".".join(path)
        if type(value) not in _FILTER_TYPES or value != value:
            raise IndexDefinitionError(
                f"where of {where}: the value of {prop!r} must be a str, int, float or "
                f"bool, got {value!r}"
            )
        pos = index._pos.get(prop)
        if pos is not None and pos == index.multi_pos:
            raise IndexDefinitionError(
                f"where of {where}: {prop!r} is the index's multi property (a list "
                "never equals a value)"
            )
        if pos is not None:
            try:
                index._coercers[pos](value)
            except ValueError as exc:
                raise IndexDefinitionError(
                    f"where of {where}: {prop!r}={value!r} does not fit the index's "
                    f"column {index.types[pos].name}: {exc}"
                ) from None
        out.append((prop, path, value))
    return tuple(out)


class Index:
    """An index definition (immutable).

    ``Index(table="index_user_id", properties=["user_id"], shard_on="user_id")`` (the
    FriendFeed form) and ``Index("by_user", {"user_id": "uuid", "published": "int"})``
    define the same kind of object; untyped properties are ``auto``.  ``unique=True``:
    at most one live entity produces a given tuple of values (``UniqueViolation``).
    ``where={"kind": "post"}``: a partial index, rows only for the entities whose
    properties (or paths) equal these values.  ``counted=True``: step 2 keeps a count
    per equality prefix of its rows, for ``DataStore.count`` (owned layout; see
    ``schemaless.counts``).
    """

    __slots__ = (
        "_coercers",
        "_key",
        "_pairs",
        "_paths",
        "_pos",
        "columns",
        "counted",
        "filter",
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
    counted: bool
    filter: tuple[tuple[str, tuple[str, ...], Any], ...]

    def __init__(
        self,
        name: str | None = None,
        properties: Sequence[str | tuple[str, str] | list[str]] | Mapping[str, str] = (),
        shard_on: str | None = None,
        *,
        table: str | None = None,
        multi: str | None = None,
        unique: bool = False,
        where: Mapping[str, Any] | None = None,
        counted: bool = False,
    ) -> None:
        self.name = _resolve_name(name, table)
        self.table = "index_" + self.name
        label = f"index {self.name!r}"

        specs = _property_specs(properties)
        if not 1 <= len(specs) <= MAX_PROPERTIES:
            raise IndexDefinitionError(
                f"{label} needs 1 to {MAX_PROPERTIES} properties, got {len(specs)}"
            )
        props, types = _typed_properties(label, specs)

        self.properties = tuple(props)
        self.types = tuple(types)
        self.columns = tuple(_column(p.split(".")) for p in props)
        self._pos = {p: i for i, p in enumerate(props)}
        listed = ", ".join(props)

        if shard_on is None:
            shard_on = props[0]
        if not isinstance(shard_on, str) or shard_on not in self._pos:
            raise IndexDefinitionError(
                f"shard_on {shard_on!r} of {label} must be one of its properties ({listed})"
            )
        self.shard_on = shard_on
        self.shard_pos = self._pos[shard_on]

        if multi is not None and (not isinstance(multi, str) or multi not in self._pos):
            raise IndexDefinitionError(
                f"multi {multi!r} of {label} must be one of its properties ({listed})"
            )
        self.multi = multi
        self.multi_pos = None if multi is None else self._pos[multi]
        if not isinstance(unique, bool):
            raise IndexDefinitionError(f"unique of {label} must be True or False, got {unique!r}")
        self.unique = unique
        if not isinstance(counted, bool):
            raise IndexDefinitionError(f"counted of {label} must be True or False, got {counted!r}")
        self.counted = counted

        _check_key_size(label, props, types)

        self._coercers = tuple(t._coerce for t in types)
        self._pairs = tuple(zip(self.properties, self._coercers, strict=True))
        self._paths = tuple(tuple(p.split(".")) if "." in p else None for p in props)
        self.filter = _filter(label, where, self)
        kinds = tuple(t.name for t in types)
        shown = tuple((p, v, type(v).__name__) for p, _, v in self.filter)
        self._key = (self.name, self.properties, kinds, shard_on, multi, unique, shown, counted)

    # -- rows --------------------------------------------------------------------------

    def rows(self, entity: Mapping[str, Any]) -> set[tuple[Any, ...]]:
        """The index rows (coerced column values, in property order) ``entity`` produces.

        No rows when an indexed property is absent or None (or the multi list is
        empty), or when the entity does not match a partial index's filter.
        InvalidEntity when a value does not fit its column.
        """
        if self.filter and not self.selects(entity):
            return set()
        get = entity.get
        paths = self._paths
        if self.multi_pos is None:
            row = []
            for pos, (prop, coerce) in enumerate(self._pairs):
                value = get(prop) if paths[pos] is None else self.lookup(entity, pos)
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
            value = get(prop) if paths[i] is None else self.lookup(entity, i)
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
                    f"got {type_name(value)}"
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
        if self.filter and not self.selects(entity):
            return None
        prop = self.properties[0]
        value = entity.get(prop) if self._paths[0] is None else self.lookup(entity, 0)
        if value is None:
            return None
        try:
            return self._coercers[0](value)
        except ValueError as exc:
            raise self._bad_value(prop, value, exc) from None

    def selects(self, entity: Mapping[str, Any]) -> bool:
        """Whether ``entity`` matches the filter of a partial index (equal values of
        equal types; a missing path, or one through a non-dict, does not match)."""
        for prop, path, want in self.filter:
            value = entity.get(prop) if len(path) == 1 else _follow(entity, path)
            if type(value) is not type(want) or value != want:
                return False
        return True

    def lookup(self, entity: Mapping[str, Any], pos: int) -> Any:
        """The stored value of property ``pos``, followed down its path (None: missing);
        for the multi property, a path that goes through lists gives the list of what
        it reaches in each element.  InvalidEntity when the path crosses a value that
        is not a dict (or a list, for a non-multi property): the put is refused."""
        prop = self.properties[pos]
        path = self._paths[pos]
        if path is None:
            return entity.get(prop)
        if pos != self.multi_pos:  # the common case: no list to cross
            value: Any = entity
            for seg in path:
                if type(value) is dict or isinstance(value, Mapping):
                    value = value.get(seg)
                elif value is None:
                    return None
                else:
                    raise self._crossed(prop, seg, value)
            return value
        values: list[Any] = [entity]
        crossed = False
        for seg in path:
            reached: list[Any] = []
            for value in values:
                items = value if isinstance(value, (list, tuple)) else (value,)
                crossed = crossed or items is value
                for item in items:
                    if isinstance(item, Mapping):
                        reached.append(item.get(seg))
                    elif item is not None:
                        raise self._crossed(prop, seg, item)
            values = reached
        if not crossed:
            return values[0] if values else None
        leaves: list[Any] = []
        for value in values:
            leaves.extend(value if isinstance(value, (list, tuple)) else (value,))
        return leaves

    def _crossed(self, prop: str, seg: str, value: object) -> InvalidEntity:
        """The error of a path that meets ``value`` where it needs a dict."""
        if isinstance(value, (list, tuple)):
            return InvalidEntity(
                f"property {prop!r} of index {self.name!r} goes through a list before "
                f"{seg!r}, but the index is not multi-valued on it"
            )
        return InvalidEntity(
            f"property {prop!r} of index {self.name!r}: the value before {seg!r} is not "
            f"a dict (got {type_name(value)})"
        )

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
                f"{type_name(value)}; give a single value"
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

    def create_table_sql(
        self, database: str, *, entity_key: bool = True, shard: bool = False
    ) -> str:
        """``CREATE TABLE IF NOT EXISTS`` for this index in ``database`` (without
        ``KEY by_entity`` unless ``entity_key``: a new index gets it when its backfill
        ends, ``entity_key_sql``; ``shard``: the owned layout's ``shard`` column, keyed)."""
        cols = ["`shard` SMALLINT UNSIGNED NOT NULL"] if shard else []
        cols += [
            f"{quote(c)} {t.sql} NOT NULL" for c, t in zip(self.columns, self.types, strict=True)
        ]
        cols.append("`entity_id` BINARY(16) NOT NULL")
        cols.append("`entity_version` BIGINT UNSIGNED NOT NULL")
        # unique: one row per value, naming its owner (docs/architecture.md)
        key = [quote(c) for c in self.columns]
        pk = [*key] if self.unique else [*key, "`entity_id`"]
        cols.append(f"PRIMARY KEY ({', '.join(pk)})")
        if shard:  # keyed, and guarded as owned.GUARD_KEY (same layer: not imported)
            cols.append(f"KEY `by_shard` ({', '.join(self._shard_key(pk))})")
            cols.append("FOREIGN KEY (`shard`) REFERENCES `owned` (`shard`)")
        if entity_key:
            cols.append("KEY `by_entity` (`entity_id`)")
        body = ",\n  ".join(cols)
        return (
            f"CREATE TABLE IF NOT EXISTS {quote(database, self.table)} (\n  {body}\n) "
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin"
        )

    @property
    def keyed_changes(self) -> bool:
        """Whether the owned layout's ``by_shard`` names the owner and its version, so
        the guard key is checked on every write that changes a row (no update trigger
        needed): within InnoDB's key limit with ``shard`` and ``entity_version`` (10
        bytes more than the primary key; docs/architecture.md, "The key guards changed
        index rows too")."""
        return sum(t.key_bytes for t in self.types) + ENTITY_ID_BYTES + 10 <= MAX_KEY_BYTES

    def _shard_key(self, pk: list[str]) -> list[str]:
        """``by_shard``'s columns: ``shard`` then the primary key (a shard's rows in key
        order, for moves and the Cleaner's scans), and when ``keyed_changes``, the owner
        and its version last (the order stays the primary key's)."""
        if not self.keyed_changes:
            return ["`shard`"]
        owner = ["`entity_id`"] if self.unique else []
        return ["`shard`", *pk, *owner, "`entity_version`"]

    def entity_key_sql(self, database: str) -> str:
        """Add ``KEY by_entity`` to this index's table in ``database`` unless it has it,
        with InnoDB's sorted build, writers going on meanwhile (docs/architecture.md,
        "The ``by_entity`` key is built last")."""
        return (
            f"CREATE INDEX IF NOT EXISTS `by_entity` ON {quote(database, self.table)}"
            " (`entity_id`) ALGORITHM=INPLACE LOCK=NONE"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable definition (see :meth:`from_dict`); ``unique``, ``where``
        and ``counted`` only when set, so a catalog written before them reads the same."""
        out: dict[str, Any] = {
            "name": self.name,
            "properties": [[p, t.name] for p, t in zip(self.properties, self.types, strict=True)],
            "shard_on": self.shard_on,
            "multi": self.multi,
        }
        if self.unique:
            out["unique"] = True
        if self.filter:
            out["where"] = {prop: value for prop, _, value in self.filter}
        if self.counted:
            out["counted"] = True
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Index:
        """Rebuild an index from :meth:`to_dict` output; IndexDefinitionError if malformed."""
        if not isinstance(d, Mapping):
            raise IndexDefinitionError(f"an index definition must be a dict, got {type_name(d)}")
        unknown = set(d) - {"name", "properties", "shard_on", "multi", "unique", "where", "counted"}
        if unknown or "name" not in d or "properties" not in d:
            raise IndexDefinitionError(
                f"malformed index definition (keys {sorted(map(str, d))}): expected "
                "name, properties, shard_on, multi, unique, where, counted"
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
            where=d.get("where"),
            counted=d.get("counted", False),
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
        extra += f", where={self.to_dict()['where']!r}" if self.filter else ""
        extra += ", counted=True" if self.counted else ""
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
