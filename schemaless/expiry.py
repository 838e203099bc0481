"""Expiry (TTL): the property that holds an entity's expiry time.

A datastore names one property (``DataStore(expire_on="expires_at")``, recorded in
the catalog's ``meta`` so that every client and the Cleaner agree).  Its value is a
time in Unix epoch seconds (int or float; absent or None: never expires).  Reads drop
an entity whose time has passed on the reading client's clock; the Cleaner deletes
it later, guarded by the version it saw (``cleaner.expire``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import InvalidEntity
from .names import check_identifier

__all__ = ["META_NAME", "check_property", "expired", "expires_at", "stamp"]

#: The catalog ``meta`` row that names the expiry property.
META_NAME = "expire_on"


def check_property(name: object) -> str:
    """The expiry property's name if valid (a property name an index may use too)."""
    if name == "id":
        raise InvalidEntity("the expiry property cannot be 'id'")
    try:
        return check_identifier(name, what="expiry property")
    except ValueError as exc:
        raise InvalidEntity(str(exc)) from None


def _seconds(value: object) -> float | None:
    """A finite number of seconds, else None (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def expires_at(entity: Mapping[str, Any], prop: str) -> float | None:
    """The entity's expiry time (epoch seconds), None if it never expires."""
    return _seconds(entity.get(prop))


def expired(entity: Mapping[str, Any], prop: str | None, now: float | None = None) -> bool:
    """Whether the entity's expiry time is at or before ``now`` (default: this clock)."""
    if prop is None:
        return False
    at = expires_at(entity, prop)
    return at is not None and at <= (time.time() if now is None else now)


def stamp(entities: Sequence[Mapping[str, Any]], prop: str | None, ttl: object) -> None:
    """Check every entity's expiry property; with ``ttl`` (seconds from now) set it in
    each dict.  Everything is checked before any dict changes: on error, nothing is."""
    if ttl is not None:
        if prop is None:
            raise InvalidEntity(
                "ttl needs an expiry property: DataStore(expire_on=...) or "
                "`schemaless expiry PROPERTY`"
            )
        seconds = _seconds(ttl)
        if seconds is None or seconds <= 0:
            raise InvalidEntity(f"ttl must be a finite number of seconds > 0, got {ttl!r}")
        if not all(isinstance(e, dict) for e in entities):
            raise InvalidEntity("an entity must be a dict to receive its expiry time")
        at = time.time() + seconds
        for entity in entities:
            entity[prop] = at  # type: ignore[index]
        return
    if prop is None:
        return
    for entity in entities:
        value = entity.get(prop) if isinstance(entity, Mapping) else None
        if value is not None and _seconds(value) is None:
            raise InvalidEntity(
                f"expiry property {prop!r} must be epoch seconds (int or float) or None, "
                f"got {value!r}"
            )
