"""Rendering: entities to and from JSON, tables, sizes and durations.

JSON cannot carry bytes, UUIDs or datetimes, so the CLI uses a small convention, the
same way in and out (``schemaless get --json`` output can be fed to ``schemaless put``):

* a one-key object ``{"$bytes": "<hex>"}`` is ``bytes``;
* ``{"$uuid": "<uuid, hyphenated or 32 hex>"}`` is a ``uuid.UUID``;
* ``{"$datetime": "<ISO 8601 with an offset>"}`` is an aware ``datetime``;
* the entity's top-level ``"id"`` may be a plain string of 32 hex characters or the
  hyphenated UUID form (16 bytes); it is always written out as 32 hex characters.

Everything else is plain JSON (strings are text).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import click

from schemaless.errors import InvalidEntity, InvalidId
from schemaless.ids import parse_id, to_id
from schemaless.jsonform import decode_special, from_json, to_jsonable

__all__ = [
    "cell",
    "echo_table",
    "entity_from_json",
    "entity_to_json",
    "from_json",
    "human_bytes",
    "human_duration",
    "json_line",
    "render_table",
    "warn_unreachable",
]

_MAX_CELL = 48


# -- JSON ------------------------------------------------------------------------------


def entity_to_json(entity: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-ready entity: ``id`` as 32 hex characters, other values by convention."""
    out = to_jsonable(entity)
    assert isinstance(out, dict)
    if "id" in entity:
        with contextlib.suppress(InvalidId):  # else leave it in the convention's form
            out["id"] = to_id(entity["id"]).hex()
        out = {"id": out.pop("id"), **out}
    return out


def json_line(value: Any) -> str:
    """One compact JSON line."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def entity_from_json(text: str) -> dict[str, Any]:
    """Parse one entity (a JSON object) written in the ``$`` convention.

    ValueError says what is wrong; the ``id`` string is checked here.
    """
    try:
        value = json.loads(text, object_hook=decode_special)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"an entity must be a JSON object, got {type(value).__name__}")
    return with_id(value)


def with_id(entity: dict[str, Any]) -> dict[str, Any]:
    """The entity with a textual ``id`` turned into its 16 bytes."""
    raw = entity.get("id")
    if isinstance(raw, str):
        try:
            entity["id"] = parse_id(raw)
        except InvalidId as exc:
            raise ValueError(f'"id": {exc}') from None
    elif isinstance(raw, uuid.UUID):
        entity["id"] = raw.bytes
    elif raw is not None and not (isinstance(raw, bytes) and len(raw) == 16):
        raise ValueError('"id" must be 32 hex characters or a UUID string')
    return entity


def decode_input(data: bytes, source: str) -> str:
    """UTF-8 input as text (a leading byte order mark dropped); InvalidEntity naming
    the source, line and byte offset of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InvalidEntity(
            f"{source} line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
            f"offset {exc.start}): write the entities in UTF-8"
        ) from None


def entities_from_text(text: str, source: str) -> Iterable[tuple[str, dict[str, Any]]]:
    """``(where, entity)`` from one JSON object, a JSON array, or JSON lines; ``where``
    names the source and the line (or array item) for messages."""
    stripped = text.strip()
    if not stripped:
        return
    if stripped[0] in "{[":
        try:
            whole = json.loads(stripped, object_hook=decode_special)
        except json.JSONDecodeError:
            whole = None  # JSON lines (or broken JSON: reported line by line below)
        except ValueError as exc:
            raise InvalidEntity(f"{source}: {exc}") from None
        if isinstance(whole, dict):
            yield source, _checked(source, whole)
            return
        if isinstance(whole, list):
            for n, item in enumerate(whole, 1):
                if not isinstance(item, dict):
                    raise InvalidEntity(f"{source} item {n}: not a JSON object")
                yield f"{source} item {n}", _checked(f"{source} item {n}", item)
            return
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield f"{source} line {n}", entity_from_json(line)
            except ValueError as exc:
                raise InvalidEntity(f"{source} line {n}: {exc}") from None


def _checked(where: str, entity: dict[str, Any]) -> dict[str, Any]:
    try:
        return with_id(entity)
    except ValueError as exc:
        raise InvalidEntity(f"{where}: {exc}") from None


# -- tables ----------------------------------------------------------------------------


def cell(value: Any, width: int = _MAX_CELL) -> str:
    """A value as table text: bytes as hex, UUIDs and datetimes as text, JSON else."""
    if value is None:
        text = ""
    elif isinstance(value, bytes):
        text = value.hex()
    elif isinstance(value, (str, uuid.UUID)):
        text = str(value)
    elif isinstance(value, datetime):
        text = value.isoformat()
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value)
    else:
        text = json.dumps(to_jsonable(value), ensure_ascii=False)
    text = " ".join(text.split()) if any(c in text for c in "\n\r\t") else text
    if width and len(text) > width:
        text = text[: width - 3] + "..."
    return text


def render_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Sequence[str] = ()
) -> list[str]:
    """Aligned lines: a header, a rule, one line per row (cells via :func:`cell`)."""
    body = [[c if isinstance(c, str) else cell(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    align_right = [h in right for h in headers]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if r else c.ljust(w)
            for c, w, r in zip(cells, widths, align_right, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(row) for row in body]
    return out


def echo_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Sequence[str] = ()
) -> None:
    """Print :func:`render_table`."""
    for text in render_table(headers, rows, right=right):
        click.echo(text)


# -- figures ---------------------------------------------------------------------------


def human_bytes(n: int | None) -> str:
    """``1536`` -> ``1.5 KiB``."""
    if n is None:
        return "unknown"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float | None) -> str:
    """``3725`` -> ``1h02m``; None -> ``unknown``."""
    if seconds is None:
        return "unknown"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def warn_unreachable(addresses: Iterable[str], left: str = "figures shown as unknown") -> None:
    """Name on stderr the servers that did not answer, and ``left``: what that leaves
    out of the output (the command still exits 0: docs/cli.md, "A partial cluster")."""
    missing = sorted(set(addresses))
    if missing:
        click.echo(f"warning: unreachable: {', '.join(missing)} ({left})", err=True)
