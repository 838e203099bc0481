"""Opening a datastore the way the CLI and the Cleaner do.

From ``--url`` or ``$SCHEMALESS_URL`` (the catalog server's DSN; user and password
also from ``$SCHEMALESS_USER``/``$SCHEMALESS_PASSWORD``), else the local cluster
(``$SCHEMALESS_LOCAL_DIR`` or ``./.schemaless-local``) with its option file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .errors import CatalogError
from .store import DataStore

__all__ = ["DEFAULT_PREFIX", "open_store"]

DEFAULT_PREFIX = "schemaless"


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
    (every server of it to create a datastore; else its first, the catalog's, as
    the datastore knows its own servers)."""
    prefix = prefix or os.environ.get("SCHEMALESS_PREFIX") or DEFAULT_PREFIX
    url = url or os.environ.get("SCHEMALESS_URL")
    if servers:
        return DataStore(list(servers), prefix=prefix, create=create, **kwargs)
    if url:
        return DataStore([url], prefix=prefix, create=create, **kwargs)
    from .local import LocalCluster  # development tooling: loaded only when used

    cluster = LocalCluster(local_dir)
    needed = cluster.servers if create else cluster.servers[:1]
    if not needed or not all(s.running() for s in needed):
        raise CatalogError(
            "no --url or SCHEMALESS_URL given and the local cluster "
            f"({cluster.base_dir}) is not running: run `schemaless local up`"
        )
    kwargs.setdefault("option_file", str(cluster.option_file))
    return DataStore([s.address for s in needed], prefix=prefix, create=create, **kwargs)
