"""OpenTelemetry spans for a datastore's calls and round trips.

``instrument(ds, tracer_provider=None)`` (the ``schemaless-mysql[tracing]`` extra): a
CLIENT span per call of a verb (``get``, ``put``, ``query``...), and under it a span
per round trip (one statement batch on one server), with the database semantic
conventions: ``db.system`` (and ``db.system.name``) "mariadb", ``db.operation.name``
(and the older ``db.operation``), ``db.namespace`` (the datastore's prefix),
``server.address``, ``server.port``, ``error.type``; a ``retry`` event on the call's
span before a batch is sent again.  Never a value, a parameter, a
body or an error message: a round trip's operation is the leading keywords of its
statements (``START;INSERT;COMMIT``), not their text.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .dsn import Address, parse_address
from .errors import SchemalessError
from .hooks import observe

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

    from .store import DataStore

__all__ = ["instrument"]

_HINT = "tracing needs opentelemetry-api: pip install 'schemaless-mysql[tracing]'"
_SYSTEM = "mariadb"
_KEYWORDS = frozenset(
    "ALTER CALL COMMIT CREATE DELETE DO DROP INSERT LOCK RELEASE RENAME REPLACE ROLLBACK"
    " SAVEPOINT SELECT SET SHOW START TRUNCATE UNLOCK UPDATE WITH XA".split()
)
_FIRST_WORD = re.compile(r"\s*\(*\s*([A-Za-z]+)")


def instrument(ds: DataStore, tracer_provider: TracerProvider | None = None) -> None:
    """Trace every call of ``ds`` from now on (``tracer_provider``: default the global
    one, ``opentelemetry.trace.set_tracer_provider``)."""
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ImportError(_HINT) from exc
    tracer = trace.get_tracer("schemaless", tracer_provider=tracer_provider)
    observe(ds, _Spans(tracer, ds.cluster.catalog.prefix))


class _Spans:
    """Spans, opened and ended by ``schemaless.hooks``."""

    def __init__(self, tracer: Tracer, namespace: str) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode, get_current_span

        self._tracer = tracer
        self._current = get_current_span
        self._kind = SpanKind.CLIENT
        self._error = Status(StatusCode.ERROR)
        self._common = {"db.system": _SYSTEM, "db.system.name": _SYSTEM, "db.namespace": namespace}

    @contextlib.contextmanager
    def call(self, verb: str) -> Iterator[None]:
        attributes = {**self._common, "db.operation": verb, "db.operation.name": verb}
        with self._tracer.start_as_current_span(
            verb,
            kind=self._kind,
            attributes=attributes,
            record_exception=False,  # messages may quote a value (a duplicate key)
            set_status_on_exception=False,
        ) as span:
            try:
                yield
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(self._error)
                raise

    def statement(self, verb: str, server: str, sql: str, seconds: float) -> None:
        end = time.time_ns()
        operation = _operation(sql)
        address = _address(server)
        attributes: dict[str, Any] = {
            **self._common,
            "db.operation": operation,
            "db.operation.name": operation,
            "server.address": address.host,
            "server.port": address.port,
        }
        span = self._tracer.start_span(
            operation, kind=self._kind, attributes=attributes, start_time=end - int(seconds * 1e9)
        )
        span.end(end_time=end)

    def retried(self, server: str, error: SchemalessError) -> None:
        address = _address(server)
        self._current().add_event(
            "retry",
            {
                "error.type": type(error).__name__,
                "server.address": address.host,
                "server.port": address.port,
            },
        )


@functools.lru_cache(maxsize=1024)
def _operation(sql: str) -> str:
    """The leading keyword of each statement of a batch (no names, no values)."""
    words: list[str] = []
    for statement in sql.split(";"):
        m = _FIRST_WORD.match(statement)
        if m is None:
            continue
        word = m.group(1).upper()
        word = word if word in _KEYWORDS else "OTHER"
        if not words or words[-1] != word:
            words.append(word)
    return ";".join(words) or "OTHER"


@functools.lru_cache(maxsize=256)
def _address(server: str) -> Address:
    return parse_address(server)[0]
