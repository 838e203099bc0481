"""Where the CLI's datastore is, for the CLI, the Cleaner and ``DataStore.from_env``.

From ``--url`` or ``$SCHEMALESS_URL`` (the catalog server's DSN; user and password
also from ``$SCHEMALESS_USER``/``$SCHEMALESS_PASSWORD``), else the local cluster
(``$SCHEMALESS_LOCAL_DIR`` or ``./.schemaless-local``) with its option file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .errors import CatalogError

__all__ = ["DEFAULT_PREFIX", "locate"]

DEFAULT_PREFIX = "schemaless"


def locate(
    url: str | None = None,
    *,
    servers: Sequence[str] = (),
    prefix: str | None = None,
    create: bool = False,
    local_dir: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The servers to hand a DataStore, and its ``prefix`` (and the local cluster's
    ``option_file``): a list of servers (for init), a URL, or the local cluster (every
    server of it to create a datastore; else its first, the catalog's, as the
    datastore knows its own servers)."""
    options = {"prefix": prefix or os.environ.get("SCHEMALESS_PREFIX") or DEFAULT_PREFIX}
    url = url or os.environ.get("SCHEMALESS_URL")
    if servers:
        return list(servers), options
    if url:
        return [url], options
    from .local import LocalCluster  # development tooling: loaded only when used

    cluster = LocalCluster(local_dir)
    needed = cluster.servers if create else cluster.servers[:1]
    stopped = [f"{s.label} ({s.address})" for s in needed if not s.running()]
    if not needed or stopped:
        state = "is not running"
        if needed and len(stopped) < len(cluster.servers):
            uses = "a new datastore uses every local server" if create else "the catalog's"
            state = f"has {', '.join(stopped)} stopped ({uses})"
        raise CatalogError(
            "no --url or SCHEMALESS_URL given and the local cluster "
            f"({cluster.base_dir}) {state}: run `schemaless local up`"
        )
    options["option_file"] = str(cluster.option_file)
    return [s.address for s in needed], options
