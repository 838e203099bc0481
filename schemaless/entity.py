"""The entity type that reads return: a plain dict that also knows its version."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .ids import to_id

__all__ = ["Entity"]


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
