"""Index rows a backfill deferred because their target's server was down.

A deferral ``(index, source, target, after, upto)`` says: the entities of logical
shard ``source`` with ``added_id`` in ``(after, upto]`` may have rows for logical shard
``target`` that the backfill did not write.  It is recorded in the transaction that
moves the source shard's checkpoint past the batch, extending the one row of
``(source, target)``; the backfill writes it when the target's server answers again,
then deletes it if it is still the range it read.  An index with a deferral cannot
become ready (``Catalog.set_ready``).  See docs/architecture.md, "Deferred rows".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog, now_us
from .names import quote
from .results import scalar

__all__ = ["Deferral", "Deferrals"]


@dataclass(frozen=True, slots=True)
class Deferral:
    """Rows of index ``index`` for logical shard ``target`` that the entities of
    ``source`` with ``added_id`` in ``(after, upto]`` may have, not yet written."""

    index: str
    source: int
    target: int
    after: int
    upto: int


class Deferrals:
    """The catalog's ``deferrals`` table."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.table = quote(catalog.db, "deferrals")

    def checkpoint(
        self,
        job: str,
        shard: int,
        position: int,
        done: bool,
        rows: int,
        deferred: Iterable[Deferral] = (),
    ) -> None:
        """Record ``deferred`` (widening the row of each source and target) and move
        the checkpoint (``Catalog.save_checkpoint``), in one transaction."""
        found = list(deferred)
        if not found:
            self.catalog.save_checkpoint(job, shard, position, done, rows)
            return
        add, params = self._add_sql(found)
        sql, more = self.catalog.checkpoint_sql(job, shard, position, done, rows)
        self.catalog.server.run(
            f"START TRANSACTION; {add}; {sql}; COMMIT", (*params, *more), commits=True
        )

    def add(self, deferred: Iterable[Deferral]) -> None:
        """Record ``deferred`` (widening the row of each source and target)."""
        found = list(deferred)
        if found:
            self.catalog.server.run(*self._add_sql(found))

    def _add_sql(self, found: list[Deferral]) -> tuple[str, list[Any]]:
        marks = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(found))
        params: list[Any] = []
        now = now_us()
        for d in found:
            params += [d.index, d.source, d.target, d.after, d.upto, now]
        return (
            f"INSERT INTO {self.table}"
            f" (index_name, source, target, after_id, upto_id, updated) VALUES {marks}"
            " ON DUPLICATE KEY UPDATE after_id = LEAST(after_id, VALUES(after_id)),"
            " upto_id = GREATEST(upto_id, VALUES(upto_id)), updated = VALUES(updated)",
            params,
        )

    def of(self, index: str) -> list[Deferral]:
        """The deferrals of an index, by source and target."""
        out = self.catalog.server.run(
            f"SELECT source, target, after_id, upto_id FROM {self.table}"
            " WHERE index_name = %s ORDER BY source, target",
            (index,),
        )
        return [Deferral(index, int(s), int(t), int(a), int(u)) for s, t, a, u in out[0]]

    def finish(self, d: Deferral) -> bool:
        """Forget a deferral that was written, unless it was widened meanwhile (then
        it stays, to be written again); whether it is gone."""
        out = self.catalog.server.run(
            f"DELETE FROM {self.table} WHERE index_name = %s AND source = %s AND target = %s"
            " AND after_id = %s AND upto_id = %s; SELECT ROW_COUNT()",
            (d.index, d.source, d.target, d.after, d.upto),
        )
        return bool(scalar(out[0]))
