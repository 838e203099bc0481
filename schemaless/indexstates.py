"""The index lifecycle in the catalog: declarations, states, blocks, and ready.

An index is recorded ``building`` under the map lock, moving the index epoch on; a
write that meets it with values it cannot hold blocks it; ``set_ready`` is a
compare-and-set that refuses while anything blocks it.  See docs/architecture.md,
"Index declarations and the fence" and "Declaring an index over data that does not fit".
"""

from __future__ import annotations

import json
from typing import Any

from .catalogdb import SERVER_US, CatalogDB, backfill_job, now_us, sweep_job, unfit_job, unique_job
from .errors import CatalogError, IndexDefinitionError
from .index import Index
from .results import one, scalar
from .topology import IndexInfo, IndexState

__all__ = ["IndexStates"]

#: Examples kept of the writes that blocked a build.
_BLOCK_EXAMPLES = 5


def _known(state: str) -> IndexState:
    """``state`` as an :class:`IndexState`; a ``CatalogError`` if it is none."""
    try:
        return IndexState(state)
    except ValueError:
        raise CatalogError(f"unknown index state {state!r}") from None


class IndexStates(CatalogDB):
    """The catalog's ``indexes`` and ``blocks`` tables, and what they gate."""

    def record_index(self, index: Index, state: IndexState, epoch: int) -> IndexInfo | None:
        """Record a new index in ``state`` and move the index epoch on from ``epoch``
        (whose successor's fence tables the caller created); an identical existing
        index is returned as is.  None if the epoch is no longer ``epoch`` (another
        index was declared meanwhile): create the next fences and try again.

        A different definition under the same name is an ``IndexDefinitionError``.
        """
        state = _known(state)
        definition = json.dumps(index.to_dict(), sort_keys=True)
        meta = self._t("meta")
        out = self.server.run(
            f"START TRANSACTION; {self._lock_map}; SET @epoch = NULL;"  # pooled sessions
            f" SELECT value INTO @epoch FROM {meta} WHERE name = 'index_epoch';"
            f" INSERT IGNORE INTO {self._t('indexes')} (name, definition, state, created, changed)"
            f" SELECT %s, %s, %s, {SERVER_US}, {SERVER_US} FROM DUAL WHERE @epoch = %s;"
            " SET @added = ROW_COUNT();"
            f" UPDATE {meta} SET value = value + 1 WHERE name = 'index_epoch' AND @added > 0;"
            f" SELECT definition, state, created, changed FROM {self._t('indexes')}"
            " WHERE name = %s; COMMIT",
            (index.name, definition, state.value, str(epoch), index.name),
            commits=True,
        )
        row = one(out[1])
        if row is None:
            return None
        stored, stored_state, created, changed = row
        existing = Index.from_dict(json.loads(stored))
        if existing != index:
            raise IndexDefinitionError(
                f"index {index.name!r} already exists with a different definition: "
                f"{existing!r}; drop and purge it first"
            )
        return IndexInfo(existing, IndexState(stored_state), int(created), int(changed))

    def set_index_state(
        self, name: str, state: IndexState, *, expect: IndexState | None = None
    ) -> bool:
        """Move an index to ``state`` (only from ``expect`` if given); True if changed."""
        state = _known(state)
        sql = f"UPDATE {self._t('indexes')} SET state = %s, changed = {SERVER_US} WHERE name = %s"
        params: list[Any] = [state.value, name]
        if expect is not None:
            sql += " AND state = %s"
            params.append(_known(expect).value)
        out = self.server.run(sql + "; SELECT ROW_COUNT()", params)
        return bool(scalar(out[0]))

    def set_ready(self, name: str) -> bool:
        """Mark a building index ready unless a write or a backfill recorded values it
        cannot hold (``block_index``, ``save_unfit``) or a backfill deferred rows
        (``schemaless.deferrals``); True if it is ready now.  The
        index row is locked first (``block_index`` holds a shared lock on it), so a
        block either commits before this reads the blocks or finds the index ready."""
        out = self.server.run(
            "START TRANSACTION; SET @marks = NULL, @writes = NULL, @deferred = NULL;"
            f" SELECT state FROM {self._t('indexes')} WHERE name = %s FOR UPDATE;"
            f" SELECT COUNT(*) INTO @marks FROM {self._t('checkpoints')}"
            " WHERE job = %s AND rows_done > 0 LOCK IN SHARE MODE;"
            f" SELECT COUNT(*) INTO @writes FROM {self._t('blocks')}"
            " WHERE index_name = %s AND writes > 0 LOCK IN SHARE MODE;"
            f" SELECT COUNT(*) INTO @deferred FROM {self._t('deferrals')}"
            " WHERE index_name = %s LOCK IN SHARE MODE;"
            f" UPDATE {self._t('indexes')} SET state = %s, changed = {SERVER_US}"
            " WHERE name = %s AND state = %s AND @marks + @writes + @deferred = 0;"
            " SELECT ROW_COUNT(); COMMIT",
            (
                name,
                unfit_job(name),
                name,
                name,
                IndexState.READY.value,
                name,
                IndexState.BUILDING.value,
            ),
            commits=True,
        )
        return bool(scalar(out[1]))

    def block_index(self, name: str, example: dict[str, Any]) -> bool:
        """Record that a write met building index ``name`` with values it cannot hold
        (``example``: JSON, one of the first few kept), so that it cannot become ready;
        False (nothing recorded) if the index is not building.  The index row's shared
        lock is all it needs on ``indexes`` (the application user's grants)."""
        line = json.dumps(example, sort_keys=True) + "\n"
        out = self.server.run(
            "START TRANSACTION; SET @state = NULL;"
            f" SELECT state INTO @state FROM {self._t('indexes')} WHERE name = %s"
            " LOCK IN SHARE MODE;"
            f" INSERT INTO {self._t('blocks')} (index_name, writes, examples, updated)"
            " SELECT %s, 1, %s, %s FROM DUAL WHERE @state = %s"
            " ON DUPLICATE KEY UPDATE"
            f" examples = IF(writes < {_BLOCK_EXAMPLES}, CONCAT(examples, VALUES(examples)),"
            " examples), writes = writes + 1, updated = VALUES(updated);"
            " SELECT @state; COMMIT",
            (name, name, line.encode(), now_us(), IndexState.BUILDING.value),
            commits=True,
            idempotent=False,
        )
        return bool(scalar(out[0]) == IndexState.BUILDING.value)

    def blocks(self, name: str) -> tuple[tuple[int, list[Any]], dict[int, tuple[int, list[Any]]]]:
        """What keeps a building index from becoming ready besides duplicates: the
        writes that met it (how many, the first few) and the entities each logical
        shard's backfill set aside (``shard -> (how many, some)``)."""
        out = self.server.run(
            f"SELECT writes, examples FROM {self._t('blocks')} WHERE index_name = %s;"
            f" SELECT shard, rows_done, `cursor` FROM {self._t('checkpoints')}"
            " WHERE job = %s AND rows_done > 0",
            (name, unfit_job(name)),
        )
        writes: tuple[int, list[Any]] = (0, [])
        for count, examples in out[0]:
            lines = bytes(examples).decode().splitlines()
            writes = (int(count), [json.loads(line) for line in lines if line])
        unfit = {
            int(shard): (int(count), json.loads(bytes(cursor or b"[]")))
            for shard, count, cursor in out[1]
        }
        return writes, unfit

    def reopen_index(self, name: str, epoch: int) -> bool:
        """Forget what blocked a building index, every checkpoint and deferral of its
        backfill (the next one scans every shard again), and move the index epoch on from
        ``epoch`` (whose successor's fences the caller created: a write in flight that
        met the index before this commits before the old fences go, or fails and
        writes again, blocking it anew); False if the epoch is no longer ``epoch``."""
        meta = self._t("meta")
        jobs = (unfit_job(name), unique_job(name), backfill_job(name))
        out = self.server.run(
            f"START TRANSACTION; {self._lock_map};"
            f" UPDATE {meta} SET value = value + 1 WHERE name = 'index_epoch' AND value = %s;"
            " SET @moved = ROW_COUNT();"
            f" DELETE FROM {self._t('blocks')} WHERE index_name = %s AND @moved > 0;"
            f" DELETE FROM {self._t('checkpoints')} WHERE job IN (%s, %s, %s)"
            " AND @moved > 0;"
            f" DELETE FROM {self._t('deferrals')} WHERE index_name = %s AND @moved > 0;"
            " SELECT @moved; COMMIT",
            (str(epoch), name, *jobs, name),
            commits=True,
        )
        return bool(out[1][0][0])

    def forget_index(self, name: str) -> None:
        """Remove a dropped index from the catalog (after its tables are gone)."""
        self.server.run(
            f"DELETE FROM {self._t('indexes')} WHERE name = %s AND state = %s;"
            f" DELETE FROM {self._t('checkpoints')} WHERE job IN (%s, %s, %s, %s);"
            f" DELETE FROM {self._t('blocks')} WHERE index_name = %s;"
            f" DELETE FROM {self._t('deferrals')} WHERE index_name = %s",
            (
                name,
                IndexState.DROPPED.value,
                backfill_job(name),
                sweep_job(name),
                unique_job(name),
                unfit_job(name),
                name,
                name,
            ),
        )
