"""Timing: run a callable over work items from N threads; throughput and percentiles."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Sample", "percentile", "run_interleaved", "run_threads"]


def percentile(sorted_values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of sorted values, nearest-rank; 0.0 if empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(p / 100.0 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


@dataclass
class Sample:
    """Latencies (seconds) and the wall time of one or more timed runs."""

    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0
    errors: int = 0
    first_error: str | None = None

    def add(self, other: Sample) -> None:
        self.latencies += other.latencies
        self.wall += other.wall
        self.errors += other.errors
        self.first_error = self.first_error or other.first_error

    @property
    def ops(self) -> int:
        return len(self.latencies)

    def summary(self) -> dict[str, Any]:
        """ops, seconds, throughput (ops/s), mean/p50/p99 latency in ms."""
        lat = sorted(self.latencies)
        n = len(lat)
        extra: dict[str, Any] = {}
        if self.errors:
            extra = {"errors": self.errors, "first_error": self.first_error}
        return {
            **extra,
            "ops": n,
            "seconds": round(self.wall, 4),
            "throughput": round(n / self.wall, 2) if self.wall > 0 else 0.0,
            "mean_ms": round(1000 * sum(lat) / n, 4) if n else 0.0,
            "p50_ms": round(1000 * percentile(lat, 50), 4),
            "p99_ms": round(1000 * percentile(lat, 99), 4),
        }


def run_threads(
    call: Callable[[Any], object],
    items: Iterator[Any],
    threads: int,
    seconds: float,
    max_ops: int | None = None,
    settle: Callable[[], object] | None = None,
) -> Sample:
    """Call ``call(item)`` from ``threads`` threads until ``seconds`` pass or items run out.

    ``items`` is shared (a list iterator or ``itertools.cycle``: their ``next`` is atomic
    under the GIL).  Latency is measured around each call; the wall time runs from the
    moment all threads are released to the moment the last one stops and ``settle``
    (work the calls left running in the background) returns.
    """
    lock = threading.Lock()
    counter = [0]
    limit = max_ops if max_ops is not None else 1 << 62
    results: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    failed: list[str] = []
    start_gate = threading.Barrier(threads + 1)
    deadline = [0.0]

    def worker(n: int) -> None:
        out = results[n]
        clock = time.perf_counter
        start_gate.wait()
        stop = deadline[0]
        try:
            while True:
                with lock:
                    if counter[0] >= limit:
                        return
                    counter[0] += 1
                item = next(items, _END)
                if item is _END:
                    return
                t0 = clock()
                try:
                    call(item)
                except Exception as exc:
                    failed.append(f"{type(exc).__name__}: {exc}")
                    if len(failed) > 1000:
                        raise
                    if clock() >= stop:
                        return
                    continue
                t1 = clock()
                out.append(t1 - t0)
                if t1 >= stop:
                    return
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(threads)]
    for t in pool:
        t.start()
    began = time.perf_counter()
    deadline[0] = began + seconds
    start_gate.wait()
    for t in pool:
        t.join()
    if settle is not None:
        settle()
    wall = time.perf_counter() - began
    if errors:
        raise errors[0]
    sample = Sample([x for r in results for x in r], wall)
    sample.errors = len(failed)
    sample.first_error = failed[0][:300] if failed else None
    return sample


def run_interleaved(
    calls: Mapping[str, tuple[Callable[[Any], object], Iterator[Any]]],
    threads: int,
    seconds: float,
    rounds: int,
    settle: Mapping[str, Callable[[], object]] | None = None,
) -> dict[str, Sample]:
    """Run each ``(call, items)`` for ``seconds`` in all, in alternating slices (A B ...
    B A per round), so that a change of background load weighs on all of them alike;
    a slice ends when its ``settle`` (by name) returns, so none leaves work to the next."""
    samples = {name: Sample() for name in calls}
    names = list(calls)
    for name in (names + names[::-1]) * rounds:
        call, items = calls[name]
        done = (settle or {}).get(name)
        samples[name].add(run_threads(call, items, threads, seconds / (2 * rounds), settle=done))
    return samples


_END = object()
