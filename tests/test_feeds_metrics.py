"""The fan-out worker's figures (``schemaless feeds work --metrics-port``): what each
round and an error that stops the worker do to them (pure: no server)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from schemaless.cli import feeds as feeds_cli
from schemaless.cli.feeds_metrics import WorkerFigures
from schemaless.errors import ShardUnavailable
from schemaless.feeds import WorkRound


def _values(figures: WorkerFigures) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family in figures.families():
        for sample in family.samples:
            assert sample.labels["feed"] == "home"
            key = sample.labels.get("state") or sample.name
            out[key] = sample.value
    return out


def test_rounds_add_posts_and_set_what_is_owed_and_the_state() -> None:
    figures = WorkerFigures("home")
    assert _values(figures)["starting"] == 1
    figures.round(WorkRound(posts=3, owed=0, failing=False, behind_s=1.5))
    figures.round(WorkRound(posts=2, owed=7, failing=True, behind_s=0.0))
    got = _values(figures)
    assert got["schemaless_feeds_posts_total"] == 5 and got["schemaless_feeds_rounds_total"] == 2
    assert got["schemaless_feeds_owed"] == 7 and got["schemaless_feeds_behind_seconds"] == 0
    assert got["failing"] == 1 and "running" not in got
    helps = {f.name: f.documentation for f in figures.families()}
    assert helps["schemaless_feeds_owed"].startswith("Posts and inbox rows it owes")
    kinds = {f.name: type(f) for f in figures.families()}
    assert kinds["schemaless_feeds_posts"] is CounterMetricFamily
    assert kinds["schemaless_feeds_owed"] is GaugeMetricFamily


class _Stopping:
    """A feed whose first ``work`` stops on a transient error (its catalog's server
    down, say), and whose second returns; what the figures said in between."""

    def __init__(self, figures: WorkerFigures) -> None:
        self.figures, self.calls, self.seen = figures, 0, ""

    def work(self, **kwargs: Any) -> int:
        self.calls += 1
        if self.calls == 1:
            kwargs["progress"](WorkRound(posts=1, owed=0, failing=False, behind_s=0.0))
            raise ShardUnavailable("the catalog's server is down")
        self.seen = next(k for k in _values(self.figures) if k in ("running", "failing"))
        return 4


def test_an_error_that_stops_the_worker_shows_it_failing_until_it_resumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(feeds_cli, "RETRY_AFTER", 0.01)
    figures = WorkerFigures("home")
    feed = _Stopping(figures)
    assert feeds_cli._work(feed, once=False, poll=0.1, figures=figures) == 4  # type: ignore[arg-type]
    assert feed.calls == 2 and feed.seen == "failing"
