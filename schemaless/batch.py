"""Batches in flight: one round trip to one server, sent now and read later.

``Batch.send`` sends without waiting; ``Reply.result`` reads the reply, retrying what
is safe to retry with the server's ``Retry`` backoff.  ``gather`` pipelines one batch
per server: every batch is sent before any reply is read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from . import deadline
from .errors import SchemalessError

if TYPE_CHECKING:
    from .connection import Server, _Conn

__all__ = ["Batch", "Reply", "Retryable", "Rows", "Sent", "gather", "gather_partial"]

Rows = list[tuple[tuple[Any, ...], ...]]
K = TypeVar("K")


class Retryable(Exception):
    """A translated error that may be sent again (see ``Reply.result``)."""

    def __init__(self, error: SchemalessError, *, after_send: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.after_send = after_send


@dataclass(slots=True)
class Batch:
    """One round trip to one server (see ``Server.run`` for the flags)."""

    server: Server
    sql: str
    params: Sequence[Any] = ()
    commits: bool = False
    idempotent: bool = True
    counts: list[int] | None = None

    def send(self) -> Reply:
        """Send it now; read the reply later with ``Reply.result``."""
        return Reply(self, self.server.send(self))


class Sent:
    """A batch sent on a taken connection, its reply not read yet."""

    __slots__ = ("at", "conn", "started")

    def __init__(self, conn: _Conn, started: float, at: float | None) -> None:
        self.conn = conn
        self.started = started
        self.at = at


class Reply:
    """A batch in flight: its connection stays taken until ``result`` or ``cancel``."""

    __slots__ = ("_batch", "_state")

    def __init__(self, batch: Batch, state: Sent | Exception) -> None:
        self._batch = batch
        self._state: Sent | Exception | None = state

    def result(self) -> Rows:
        """The rows of each result set; errors are raised here, retried as ``run`` does."""
        try:
            return self._first()
        except Retryable as exc:
            return self._retry(exc)

    def _first(self) -> Rows:
        """The reply as sent (``Retryable`` if it may be sent again)."""
        state, self._state = self._state, None
        if state is None:
            raise RuntimeError("Reply.result called twice")
        if isinstance(state, Exception):
            raise state
        return self._batch.server.receive(self._batch, state)

    def _retry(self, exc: Retryable) -> Rows:
        """Send again after a retryable error, with backoff, as long as allowed."""
        batch, server = self._batch, self._batch.server
        delays = server.options.retry.delays()
        at = deadline.current()
        while True:
            delay = next(delays, None)
            if (
                delay is None
                or (exc.after_send and not batch.idempotent)
                or (at is not None and time.monotonic() + delay >= at)
            ):
                raise exc.error from exc.error.__cause__
            if server.on_retry is not None:
                server.on_retry(server.name, exc.error)
            time.sleep(delay)
            self._state = server.send(batch)
            try:
                return self._first()
            except Retryable as again:
                exc = again

    def cancel(self) -> None:
        """Give up on the reply: its connection is closed, never reused."""
        state, self._state = self._state, None
        if isinstance(state, Sent):
            self._batch.server.release(state.conn, healthy=False)


def gather(batches: Mapping[K, Batch]) -> dict[K, Rows]:
    """Run one batch per key, the servers working in parallel; every batch finishes
    before this returns, and the first error is raised after."""
    results, errors = gather_partial(batches)
    for error in errors.values():
        raise error
    return results


def gather_partial(batches: Mapping[K, Batch]) -> tuple[dict[K, Rows], dict[K, SchemalessError]]:
    """Like ``gather`` but returns the errors per key instead of raising.

    Every batch is sent before any reply is read, from this thread: no worker threads,
    and the servers overlap their work.  Connections are taken in server-name order
    and retries wait until every first reply is read (this thread then holds no other
    connection), so callers that wait for full pools cannot deadlock each other.
    """
    keys = sorted(batches, key=lambda k: batches[k].server.name)
    replies: dict[K, Reply] = {}
    again: dict[K, tuple[Reply, Retryable]] = {}
    results: dict[K, Rows] = {}
    errors: dict[K, SchemalessError] = {}
    try:
        for key in keys:
            replies[key] = batches[key].send()
        for key in keys:
            reply = replies.pop(key)
            try:
                results[key] = reply._first()
            except Retryable as retryable:
                again[key] = (reply, retryable)
            except SchemalessError as exc:
                errors[key] = exc
    finally:
        for reply in replies.values():
            reply.cancel()
    for key, (reply, first) in again.items():
        try:
            results[key] = reply._retry(first)
        except SchemalessError as error:
            errors[key] = error
    return results, errors
