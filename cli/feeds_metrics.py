"""``schemaless feeds work --metrics-port``: the fan-out worker's figures, served for
Prometheus (prometheus_client, the ``schemaless-mysql[metrics]`` extra)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from schemaless.cleaner import metrics  # type: ignore[import-not-found, unused-ignore]
from schemaless.feeds import WorkRound

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["WorkerFigures", "serving"]


class WorkerFigures:
    """What the worker did so far, updated after each round (``Feeds.work(progress=)``):
    ``posts`` and ``rounds`` (counters), ``owed`` (posts and inbox rows it still owes),
    ``behind_seconds`` (0 when caught up), and its state (``running``, or ``failing``
    while a server does not answer)."""

    COUNTERS = frozenset({"posts", "rounds"})
    HELPS = {
        "posts": "Posts the fan-out worker read from the change feed",
        "rounds": "Rounds of the fan-out worker",
        "owed": "Posts and inbox rows it owes: a server did not answer",
        "behind_seconds": "Age of the newest change it read while more wait (0: caught up)",
    }

    def __init__(self, feed: str) -> None:
        self.feed = feed
        self._lock = threading.Lock()
        self._values: dict[str, Any] = {"state": "starting", "posts": 0, "rounds": 0}
        self._values |= {"owed": 0, "behind_seconds": 0.0}

    def round(self, done: WorkRound) -> None:
        """Count a round."""
        with self._lock:
            self._values["posts"] += done.posts
            self._values["rounds"] += 1
            self._values["owed"] = done.owed
            self._values["behind_seconds"] = done.behind_s
            self._values["state"] = "failing" if done.failing else "running"

    def failing(self) -> None:
        """The worker stopped on an error and waits to resume."""
        with self._lock:
            self._values["state"] = "failing"

    def families(self) -> list[Metric]:
        """The figures as metric families ``schemaless_feeds_*``, labelled by feed."""
        with self._lock:
            values = dict(self._values)
        labels = {"feed": self.feed}
        out: list[Metric] = metrics.figure_families(
            values, labels, prefix="schemaless_feeds", counters=self.COUNTERS, helps=self.HELPS
        )
        return out


@contextlib.contextmanager
def serving(figures: WorkerFigures, port: int | None, host: str) -> Iterator[None]:
    """Serve ``figures`` at ``http://host:port/metrics`` for the block (nothing without
    a port); the address on stderr."""
    if port is None:
        yield
        return
    try:
        server = metrics.MetricsServer(figures.families, port, host)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}", param_hint="'--metrics-port'"
        ) from exc
    except ImportError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"metrics at http://{host}:{server.port}/metrics", err=True)
    try:
        yield
    finally:
        server.close()
