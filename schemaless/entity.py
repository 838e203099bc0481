"""The entity type that reads return: a plain dict that also knows its version."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InvalidEntity
from .ids import to_id

__all__ = ["Entity", "updated"]


class Entity(dict[str, Any]):
    """A stored entity: a plain dict that also knows its ``version``."""

    __slots__ = ("version",)

    def __init__(self, data: Mapping[str, Any], version: int) -> None:
        super().__init__(data)
        self.version = version

    @property
    def id(self) -> bytes:
        """The entity's 16-byte id."""
        return to_id(self["id"])

    def __repr__(self) -> str:
        return f"Entity({dict.__repr__(self)}, version={self.version})"


def updated(result: Any, key: bytes) -> dict[str, Any]:
    """What an ``update()`` function returned, as the entity to store under ``key``:
    ``InvalidEntity`` unless it is a mapping with that id or none."""
    if not isinstance(result, Mapping):
        hint = " (did it change the entity in place without returning it?)"
        raise InvalidEntity(
            "update() needs its function to return the new entity, a dict; got "
            f"{type(result).__name__}{hint if result is None else ''}"
        )
    new = dict(result)
    if to_id(new.setdefault("id", key)) != key:
        raise InvalidEntity("update() must not change the entity's id")
    return new
