"""What a dump's parts share: its errors, the manifest's name, the page and batch
sizes, and the restore of one file resumed from its checkpoint (``schemaless.dump``
for entities, ``schemaless.dumptables`` for the module tables)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from .errors import CatalogError

if TYPE_CHECKING:
    from .catalog import Topology
    from .store import DataStore

__all__ = ["BATCH", "MANIFEST", "PAGE", "DumpError", "Progress", "not_empty", "restore_file"]

MANIFEST = "manifest.json"
PAGE = 2000  # rows per read inside a shard's snapshot
BATCH = 1000  # records per restore round (one statement batch per server)

Progress = Callable[[int], None]
T = TypeVar("T")


class DumpError(CatalogError):
    """A dump directory that cannot be written or read back."""


def not_empty(topo: Topology, what: str) -> CatalogError:
    """A target that is neither empty nor this dump's interrupted restore: what to do."""
    return CatalogError(
        f"the target datastore {topo.prefix!r} already has {what}: a restore never merges "
        "into a datastore in use; restore into a new, empty one (`schemaless init --prefix "
        "NEW ...`, then `schemaless restore DIR --prefix NEW`), or drop this one first"
    )


def restore_file(
    ds: DataStore,
    job: str,
    shard: int,
    records: Iterator[T],
    write: Callable[[list[T]], None],
    position: int,
    progress: Progress | None,
) -> None:
    """Write one dump file's records after the first ``position`` (written by an
    earlier run), saving the checkpoint (``job``, ``shard``) after each batch."""
    n = sum(1 for _ in itertools.islice(records, position))  # written before
    if progress is not None and n:
        progress(n)
    while True:
        batch = list(itertools.islice(records, BATCH))
        if batch:
            write(batch)
        n += len(batch)
        ds.cluster.catalog.save_checkpoint(job, shard, n, len(batch) < BATCH, n)
        if progress is not None and batch:
            progress(len(batch))
        if len(batch) < BATCH:
            return
