"""Step 3 of the write protocol in the background.

A write returns once its entity has committed; the index rows its old body produced
(and the new one does not) are deleted by one thread of the datastore, in batches that
gather many writes' rows into one transaction per server.  Deleting them is never
needed for correctness: queries re-check every row against the stored entity, and the
``entity_version < V`` guard spares any row a newer write produced, whenever the
delete runs.  A row whose delete fails, or is lost with the process, is an orphan the
Cleaner removes.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable

from . import forking
from .writes import IndexRow

__all__ = ["StaleRows"]

log = logging.getLogger(__name__)

#: at interpreter exit, how long queued rows may delay it (then the Cleaner has them)
EXIT_WAIT = 10.0
#: an idle thread ends after this long (the next write starts one), so a datastore
#: dropped without close() is not kept alive by it
IDLE_EXIT = 1.0


class StaleRows:
    """Deletes stale index rows off the writers' path; ``delete`` runs one batch.

    A batch waits up to ``linger`` seconds for more writes' rows (up to ``batch``
    rows), so that one commit per server carries many writes' deletes; ``flush`` and
    ``close`` cut the wait short.  At most ``max_pending`` rows wait: past that, a
    writer deletes its own rows before returning (as without this queue), so a backlog
    cannot grow without bound.
    """

    def __init__(
        self,
        delete: Callable[[list[IndexRow]], None],
        *,
        max_pending: int = 20_000,
        batch: int = 1_000,
        linger: float = 0.005,
    ) -> None:
        self._delete = delete
        self._max_pending = max_pending
        self._batch = batch
        self._linger = linger
        self._pending: list[IndexRow] = []
        self._cond = threading.Condition()
        self._submitted = 0  # rows queued so far
        self._done = 0  # rows whose delete has run (or failed: left to the Cleaner)
        self._flushing = 0  # callers waiting in flush(): no lingering
        self._thread: threading.Thread | None = None
        self._closed = False
        atexit.register(_flush_at_exit, weakref.ref(self))
        forking.register(self)

    def after_fork(self) -> None:
        """In a forked child: no worker thread, a fresh lock, and none of the parent's
        queued rows (the parent deletes them)."""
        self._cond = threading.Condition()
        self._thread = None
        self._pending = []
        self._submitted = self._done = self._flushing = 0

    def submit(self, rows: list[IndexRow]) -> None:
        """Queue rows for deletion (or delete them now, if the queue is full or closed)."""
        with self._cond:
            if not self._closed and len(self._pending) + len(rows) <= self._max_pending:
                self._pending += rows
                self._submitted += len(rows)
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._work, name="schemaless-stale-rows", daemon=True
                    )
                    self._thread.start()
                self._cond.notify_all()
                return
        self._delete(rows)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the rows queued before this call are deleted (or left to the
        Cleaner); False if ``timeout`` seconds passed first."""
        with self._cond:
            target = self._submitted
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: self._done >= target, timeout)
            finally:
                self._flushing -= 1

    def close(self) -> None:
        """Delete what is queued, then stop the thread; later rows are deleted at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending) or self._closed, IDLE_EXIT)
                if not self._pending:
                    self._thread = None
                    return
                self._cond.wait_for(self._ready, self._linger)
                rows = self._pending[: self._batch]
                del self._pending[: self._batch]
            try:
                self._delete(rows)
            except Exception:  # never let the thread die: the Cleaner has these rows
                log.exception("stale index rows left for the Cleaner")
            with self._cond:
                self._done += len(rows)
                self._cond.notify_all()

    def _ready(self) -> bool:
        """A batch should go now (called with the lock held)."""
        return len(self._pending) >= self._batch or self._closed or self._flushing > 0


def _flush_at_exit(ref: weakref.ref[StaleRows]) -> None:
    """A script that ends without ``close()`` still deletes what it queued (bounded)."""
    stale = ref()
    if stale is not None:
        stale.flush(EXIT_WAIT)
