"""``--where`` expressions: ``PROPERTY OP VALUE`` into DataStore.query conditions.

``OP`` is ``=``, ``>``, ``>=``, ``<`` or ``<=``; ``PROPERTY__startswith=VALUE`` is a
prefix (a str(N) or bytes(N) column).  ``VALUE`` is converted by the type of the index
column it is compared with:

=========  ================================================================
int        an integer (``-12``)
float      a number (``1.5``, ``2e3``, ``7``)
bool       ``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``)
str(N)     the text as given
uuid       32 hex characters or the hyphenated UUID form (16 bytes)
bytes(N)   hex digits, optionally after ``0x``
auto       an integer if it looks like one, else a float if it looks like one,
           else the text
=========  ================================================================

Two ways to say exactly what you mean: a value in double quotes is a JSON string
(``title="42"`` is the text 42, ``title=" padded "`` keeps its spaces), and a cast
prefix ``int:``, ``float:``, ``bool:``, ``str:``, ``bytes:`` or ``uuid:`` converts the
rest as that type (``user_id=uuid:0f8e...`` on an untyped column).  Spaces around the
value are ignored otherwise.  A missing value (``link>``, ``title=``) is refused, as is
an unquoted value starting with ``=``, ``<`` or ``>`` (``a==1``, ``a=>1``): ``link>""``
is the empty string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from schemaless.errors import InvalidId, InvalidQuery
from schemaless.ids import parse_id
from schemaless.index import Index
from schemaless.query import prefix_value

from .options import BadOption

__all__ = ["OPERATORS", "literal", "parse_where"]

#: ``--where`` operator -> DataStore.query keyword suffix.
OPERATORS = {"=": "", ">": "__gt", ">=": "__gte", "<": "__lt", "<=": "__lte"}
_STARTSWITH = "__startswith"

_EXPR = re.compile(
    r"\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*(<=|>=|=|<|>)(.*)\Z", re.DOTALL
)
_CAST = re.compile(r"(str|int|float|bool|bytes|uuid):(.*)\Z", re.DOTALL)
_INT = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?\Z")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def literal(text: str, type_name: str) -> Any:
    """The Python value of a ``--where`` literal for a column of ``type_name``.

    ValueError says what was expected.
    """
    text = text.strip()
    if not text:
        raise ValueError('no value after the operator (write "" for the empty string)')
    if text[0] in "=<>":
        raise ValueError(
            f"a value starting with {text[0]!r} (an operator typed twice?): "
            "a text that starts so goes in double quotes"
        )
    quoted = len(text) >= 2 and text[0] == text[-1] == '"'
    kind = type_name.partition("(")[0]
    if quoted:
        try:
            text = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"bad quoted string: {exc.msg}") from None
    else:
        cast = _CAST.match(text)
        if cast:
            kind, text = cast.group(1), cast.group(2)
    if kind == "auto":
        if not quoted and _INT.match(text):
            return int(text)
        if not quoted and _FLOAT.match(text):
            return float(text)
        return text
    if kind == "str":
        return text
    if kind == "int":
        if not _INT.match(text):
            raise ValueError(f"expected an integer, got {text[:40]!r}")
        return int(text)
    if kind == "float":
        if not _FLOAT.match(text):
            raise ValueError(f"expected a number, got {text[:40]!r}")
        return float(text)
    if kind == "bool":
        folded = text.lower()
        if folded in _TRUE:
            return True
        if folded in _FALSE:
            return False
        raise ValueError(f"expected true or false, got {text[:40]!r}")
    if kind == "uuid":
        try:
            return parse_id(text)
        except InvalidId:
            raise ValueError(f"expected 32 hex characters or a UUID, got {text[:40]!r}") from None
    if kind == "bytes":
        digits = text[2:] if text[:2].lower() == "0x" else text
        try:
            return bytes.fromhex(digits)
        except ValueError:
            raise ValueError(f"expected hex digits, got {text[:40]!r}") from None
    raise ValueError(f"unknown column type {type_name!r}")


def parse_where(expressions: Sequence[str], index: Index) -> dict[str, Any]:
    """DataStore.query keyword conditions from ``--where`` expressions on ``index``.

    A bad expression is a :class:`BadOption` naming ``--where``.
    """
    conditions: dict[str, Any] = {}
    for expr in expressions:
        m = _EXPR.match(expr)
        if m is None:
            raise BadOption(
                f"{expr!r}: expected PROPERTY OP VALUE with OP one of = > >= < <= "
                "(or PROPERTY__startswith=VALUE; there is no != or in)",
                "--where",
            )
        prop, op, text = m.groups()
        suffix = OPERATORS[op]
        if op == "=" and prop not in index.properties and prop.endswith(_STARTSWITH):
            prop, suffix = prop[: -len(_STARTSWITH)], _STARTSWITH
        if prop not in index.properties:
            raise BadOption(
                f"{expr!r}: index {index.name!r} has no property {prop!r} "
                f"(its properties: {', '.join(index.properties)})",
                "--where",
            )
        ctype = index.types[index.properties.index(prop)]
        try:
            value = literal(text, ctype.name)
        except ValueError as exc:
            raise BadOption(f"{expr!r}: {prop} is {ctype.name}: {exc}", "--where") from None
        key = prop + suffix
        try:
            if suffix == _STARTSWITH:
                prefix_value(index, prop, key, value)
            else:
                index.coerce_query_value(prop, value)
        except InvalidQuery as exc:
            raise BadOption(f"{expr!r}: {exc}", "--where") from None
        if key in conditions:
            raise BadOption(f"{expr!r}: a second {op!r} condition on {prop!r}", "--where")
        conditions[key] = value
    return conditions
