"""JSON of entities in the ``$`` convention (``schemaless.cli.output`` describes it):
bytes, UUIDs and datetimes as one-key objects, the same way in and out (the CLI and
``schemaless.dump``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

__all__ = ["decode_special", "from_json", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    """``value`` with bytes, UUIDs and datetimes in the ``$`` convention."""
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def decode_special(obj: dict[str, Any]) -> Any:
    """A JSON object in the ``$`` convention as its value (others as they are)."""
    if len(obj) != 1:
        return obj
    ((key, text),) = obj.items()
    if key not in ("$bytes", "$uuid", "$datetime"):
        return obj
    if not isinstance(text, str):
        raise ValueError(f"{key} takes a string, got {type(text).__name__}")
    if key == "$bytes":
        try:
            return bytes.fromhex(text)
        except ValueError:
            raise ValueError(f"$bytes takes hex digits, got {text[:40]!r}") from None
    if key == "$uuid":
        try:
            return uuid.UUID(text)
        except ValueError:
            raise ValueError(f"$uuid takes a UUID, got {text[:40]!r}") from None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"$datetime takes ISO 8601, got {text[:40]!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"$datetime needs an offset (e.g. +00:00), got {text[:40]!r}")
    return moment


def from_json(text: str) -> Any:
    """Parse JSON text written in the ``$`` convention (the inverse of ``to_jsonable``)."""
    return json.loads(text, object_hook=decode_special)
