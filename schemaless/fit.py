"""Whether the stored entities fit an index: every value fits its column's type and,
for a unique index, no value repeats.

``Fit`` tallies entities (the dry run's estimate feeds it its own sample); ``sample``
reads the newest live entities (``SAMPLE`` in all, one statement per server) for the
check of a declaration (``DataStore.declare_index``).
A sample finds repeats only among the entities it read: the backfill finds the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import CorruptEntity, InvalidEntity
from .expiry import expired
from .ids import id_hex
from .index import Index
from .reader import newest_reads
from .scatter import bare

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["SAMPLE", "Fit", "sample"]

#: About how many live entities ``sample`` reads (the newest).
SAMPLE = 20_000
_EXAMPLES = 5  # shown of each kind


@dataclass
class Fit:
    """What a set of entities holds for ``index``: how many were checked, how many
    have a value that does not fit (``unfit``) or, for a unique index, a value that
    an entity checked before has (``repeated``), with a few ``(id, shard, why)`` each."""

    index: Index
    checked: int = 0
    unfit: int = 0
    repeated: int = 0
    unfit_examples: list[tuple[str, int, str]] = field(default_factory=list)
    repeat_examples: list[tuple[str, int, str]] = field(default_factory=list)
    _owners: dict[tuple[Any, ...], bytes] = field(default_factory=dict, repr=False)

    @property
    def fits(self) -> bool:
        """Whether nothing was found that the index cannot hold."""
        return not (self.unfit or self.repeated)

    def add(self, key: bytes, shard: int, entity: Mapping[str, Any]) -> set[tuple[Any, ...]] | None:
        """Check one live entity; its index rows (None: a value does not fit)."""
        self.checked += 1
        try:
            rows = self.index.rows(entity)
        except InvalidEntity as exc:
            self.unfit += 1
            if len(self.unfit_examples) < _EXAMPLES:
                self.unfit_examples.append((id_hex(key), shard, str(exc)))
            return None
        if self.index.unique:
            for values in rows:
                other = self._owners.setdefault(values, key)
                if other != key:
                    self.repeated += 1
                    if len(self.repeat_examples) < _EXAMPLES:
                        shown = ", ".join(
                            f"{k}={v!r}" for k, v in self.index.readable(values).items()
                        )
                        why = f"{shown} is also the value of entity {id_hex(other)}"
                        self.repeat_examples.append((id_hex(key), shard, why))
                    break
        return rows

    def summary(self) -> str:
        """One line: why the index is not declared, and how to declare it anyway."""
        found = []
        if self.unfit:
            found.append(f"{self.unfit:,} have a value that does not fit its column's type")
        if self.repeated:
            found.append(f"{self.repeated:,} share a value of the unique index with another")
        return (
            f"index {self.index.name!r} does not fit the stored entities: of {self.checked:,}"
            f" sampled, {' and '.join(found)}; it could not become ready until they are "
            "fixed: fix them first, or declare it anyway with force (CLI: --force)"
        )

    def examples(self) -> list[str]:
        """One line per example entity."""
        return [
            f"  entity {key} on shard {shard}: {why}"
            for key, shard, why in self.unfit_examples + self.repeat_examples
        ]


def sample(
    cluster: Cluster,
    decode: Callable[[bytes, int, int, bytes], Mapping[str, Any]],
    index: Index,
    rows: int = SAMPLE,
) -> Fit:
    """Check about ``rows`` of the newest live entities (``reader.newest_reads``)
    against ``index``; bodies that cannot be decoded, and expired entities (which hold
    no value: docs/architecture.md, "Expiry"), are skipped."""
    topo = cluster.current()
    found = cluster.scatter(topo, newest_reads(topo, rows), bare).results
    fit, now = Fit(index), time.time()
    for sets in found.values():
        for shard, key, version, body in sets[0]:
            try:
                entity = decode(bytes(key), int(shard), int(version), bytes(body))
            except CorruptEntity:
                continue
            if not expired(entity, topo.expire_on, now):
                fit.add(bytes(key), int(shard), entity)
    return fit
