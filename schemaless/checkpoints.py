"""The Cleaner's jobs in the catalog: checkpoints, keyset cursors, and what a
backfill found (a unique index's duplicates, entities that do not fit).

One ``checkpoints`` row per (job, logical shard); a checkpoint never moves backward,
so a job resumes where it stopped after any crash.  Job names: ``catalogdb``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .catalogdb import CatalogDB, backfill_job, now_us, unfit_job, unique_job

__all__ = ["MAX_SHOWN_BYTES", "Checkpoints"]

#: The JSON of the duplicates kept per logical shard (the ``cursor`` column is a BLOB).
MAX_SHOWN_BYTES = 60_000


class Checkpoints(CatalogDB):
    """The catalog's ``checkpoints`` table."""

    def checkpoints(self, job: str) -> dict[int, tuple[int, bool, int]]:
        """``shard -> (position, done, rows_done)`` for a job."""
        out = self.server.run(
            f"SELECT shard, position, done, rows_done FROM {self._t('checkpoints')} WHERE job = %s",
            (job,),
        )
        return {int(s): (int(p), bool(d), int(n)) for s, p, d, n in out[0]}

    def save_checkpoint(self, job: str, shard: int, position: int, done: bool, rows: int) -> None:
        """Advance a checkpoint; it never moves backward."""
        self.server.run(*self.checkpoint_sql(job, shard, position, done, rows))

    def checkpoint_sql(
        self, job: str, shard: int, position: int, done: bool, rows: int
    ) -> tuple[str, tuple[Any, ...]]:
        """The statement of ``save_checkpoint`` (to run in a transaction of its own)."""
        return (
            f"INSERT INTO {self._t('checkpoints')}"
            " (job, shard, position, done, rows_done, updated) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON DUPLICATE KEY UPDATE"
            " rows_done = IF(VALUES(position) >= position, VALUES(rows_done), rows_done),"
            " done = IF(VALUES(position) >= position, VALUES(done), done),"
            " updated = VALUES(updated),"
            " position = GREATEST(position, VALUES(position))",
            (job, shard, position, int(done), rows, now_us()),
        )

    def save_duplicates(self, index: str, shard: int, found: int, shown: list[Any]) -> None:
        """Record the duplicates a backfill of a unique index found on a logical shard:
        how many, and ``shown`` (JSON; at most ``MAX_SHOWN_BYTES`` of it is kept)."""
        self._save_found(unique_job(index), shard, found, shown)

    def save_unfit(self, index: str, shard: int, found: int, shown: list[Any]) -> None:
        """Record the entities a backfill set aside on a logical shard because their
        values do not fit the index (as ``save_duplicates``): it cannot become ready."""
        self._save_found(unfit_job(index), shard, found, shown)

    def _save_found(self, job: str, shard: int, found: int, shown: list[Any]) -> None:
        text = json.dumps(shown, sort_keys=True)
        while len(text) > MAX_SHOWN_BYTES and shown:
            shown = shown[: len(shown) // 2]
            text = json.dumps(shown, sort_keys=True)
        self.server.run(
            f"REPLACE INTO {self._t('checkpoints')}"
            " (job, shard, position, done, rows_done, `cursor`, updated)"
            " VALUES (%s, %s, 0, 0, %s, %s, %s)",
            (job, shard, found, text.encode(), now_us()),
        )

    def duplicates(self, index: str) -> dict[int, tuple[int, list[Any]]]:
        """``shard -> (how many, some of them)`` as recorded by ``save_duplicates``."""
        out = self.server.run(
            f"SELECT shard, rows_done, `cursor` FROM {self._t('checkpoints')} WHERE job = %s",
            (unique_job(index),),
        )
        return {int(s): (int(n), json.loads(bytes(c or b"[]"))) for s, n, c in out[0]}

    def rescan(self, index: str, shards: Iterable[int]) -> None:
        """Forget the duplicates, the backfill checkpoints and the deferrals of these
        logical shards, so that the next backfill scans them again."""
        chosen = sorted(set(shards))
        if not chosen:
            return
        marks = ", ".join(["%s"] * len(chosen))
        self.server.run(
            f"DELETE FROM {self._t('checkpoints')} WHERE job IN (%s, %s) AND shard IN ({marks});"
            f" DELETE FROM {self._t('deferrals')} WHERE index_name = %s AND source IN ({marks})",
            (unique_job(index), backfill_job(index), *chosen, index, *chosen),
        )

    def cursors(self, job: str) -> dict[int, tuple[int, bytes | None, bool, int]]:
        """``shard -> (position, cursor, done, rows_done)`` for a job that keeps a cursor."""
        out = self.server.run(
            f"SELECT shard, position, `cursor`, done, rows_done FROM {self._t('checkpoints')}"
            " WHERE job = %s",
            (job,),
        )
        return {
            int(s): (int(p), bytes(c) if c is not None else None, bool(d), int(n))
            for s, p, c, d, n in out[0]
        }

    def save_cursor(
        self, job: str, shard: int, position: int, cursor: bytes | None, done: bool, rows: int
    ) -> None:
        """Record a keyset cursor within round ``position``; an older round never wins."""
        self.server.run(
            f"INSERT INTO {self._t('checkpoints')}"
            " (job, shard, position, `cursor`, done, rows_done, updated)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " ON DUPLICATE KEY UPDATE"
            " `cursor` = IF(VALUES(position) >= position, VALUES(`cursor`), `cursor`),"
            " rows_done = IF(VALUES(position) >= position, VALUES(rows_done), rows_done),"
            " done = IF(VALUES(position) >= position, VALUES(done), done),"
            " updated = VALUES(updated),"
            " position = GREATEST(position, VALUES(position))",
            (job, shard, position, cursor, int(done), rows, now_us()),
        )
