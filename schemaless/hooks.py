"""Observers of one datastore's calls, round trips and retries, attached after it opened.

``observe(ds, observer)`` wraps the datastore's verbs on that instance only and chains
the servers' hooks (``Server.tracer``, called after every round trip, and
``Server.on_retry``): a datastore nobody observes runs the code it ran before, at no
cost.  ``schemaless.metrics`` and ``schemaless.tracing`` are the observers.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from .connection import Tracer
from .errors import SchemalessError

if TYPE_CHECKING:
    from .store import DataStore

__all__ = ["VERBS", "Observer", "observe"]

#: The datastore's verbs that observers see as calls (``iter`` and ``changes`` are
#: generators: their round trips count under the verb "other").
VERBS = (
    "get",
    "get_many",
    "get_by",
    "query",
    "put",
    "put_many",
    "update",
    "delete",
    "delete_many",
)

_VERB: ContextVar[str] = ContextVar("schemaless_verb", default="other")


class Observer(Protocol):
    """What a datastore's observer is told."""

    def call(self, verb: str) -> contextlib.AbstractContextManager[None]:
        """Entered around each call of a verb; sees the exception that ends it."""

    def statement(self, verb: str, server: str, sql: str, seconds: float) -> None:
        """After each round trip (``sql``: the batch's template, without values)."""

    def retried(self, server: str, error: SchemalessError) -> None:
        """Before a batch is sent again after a retryable error."""


def observe(ds: DataStore, observer: Observer) -> None:
    """Tell ``observer`` about every call, round trip and retry of ``ds`` from now on."""
    observers: list[Observer] | None = ds.__dict__.get("_observers")
    if observers is None:
        observers = ds.__dict__["_observers"] = []
        for name in VERBS:
            setattr(ds, name, _wrapped(getattr(ds, name), name, observers))
    observers.append(observer)
    cluster = ds.cluster
    cluster.tracer = _chain_tracer(cluster.tracer, observer)
    cluster.on_retry = _chain_retry(cluster.on_retry, observer)
    for server in cluster.servers():
        server.tracer = _chain_tracer(server.tracer, observer)
        server.on_retry = _chain_retry(server.on_retry, observer)


def _wrapped(method: Callable[..., Any], name: str, observers: list[Observer]) -> Any:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        token = _VERB.set(name)
        try:
            with contextlib.ExitStack() as stack:
                for observer in observers:
                    stack.enter_context(observer.call(name))
                return method(*args, **kwargs)
        finally:
            _VERB.reset(token)

    return call


def _chain_tracer(tracer: Tracer | None, observer: Observer) -> Tracer:
    def traced(server: str, sql: str, seconds: float) -> None:
        if tracer is not None:
            tracer(server, sql, seconds)
        observer.statement(_VERB.get(), server, sql, seconds)

    return traced


def _chain_retry(
    hook: Callable[[str, SchemalessError], None] | None, observer: Observer
) -> Callable[[str, SchemalessError], None]:
    def retried(server: str, error: SchemalessError) -> None:
        if hook is not None:
            hook(server, error)
        observer.retried(server, error)

    return retried
