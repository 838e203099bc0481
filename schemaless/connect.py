"""Opening a datastore the way the CLI and the Cleaner do (``schemaless.locate``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .locate import DEFAULT_PREFIX, locate
from .store import DataStore

__all__ = ["DEFAULT_PREFIX", "open_store"]


def open_store(
    url: str | None = None,
    *,
    servers: Sequence[str] = (),
    prefix: str | None = None,
    create: bool = False,
    local_dir: str | None = None,
    **kwargs: Any,
) -> DataStore:
    """A DataStore from a URL, a list of servers (for init), or the local cluster
    (``locate``); ``kwargs`` are the constructor's."""
    found, options = locate(url, servers=servers, prefix=prefix, create=create, local_dir=local_dir)
    return DataStore(found, create=create, **{**options, **kwargs})
