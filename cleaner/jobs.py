"""``cleaner --index=NAME --jobs N``: N worker processes share one backfill.

Worker K is the same command with ``--part K/N`` (processes, not threads: decoding is
CPU-bound and the GIL binds), started in its own session so that a terminal's Ctrl-C
reaches the supervisor only.  The supervisor shows one progress line from the
checkpoints in the catalog (what ``schemaless index status`` reads), starts a worker
that died again (at most ``restarts`` times per part, with a log line each time) and
reports one that failed for good.  A stop request (SIGTERM/SIGINT) is passed on to
the workers as one SIGTERM each: they finish their batch, checkpoint and exit, and
the supervisor waits for them."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import click

from schemaless.catalog import IndexState, backfill_job
from schemaless.deferrals import Deferrals
from schemaless.errors import CatalogError, IndexDefinitionError, SchemalessError
from schemaless.store import DataStore

from .backfill import reopen
from .daemon import backfill_name
from .estimate import Span, added_ranges
from .metrics import HELD, held_text
from .progress import Progress
from .runtime import Runtime, Shutdown

__all__ = ["RESTARTS", "Supervisor", "describe_exit", "forwarded_options"]

log = logging.getLogger("schemaless.cleaner")

#: How many times a part's worker is started again after it died.
RESTARTS = 3
#: Figures summed over the workers' runs (from their last heartbeat).
_SUMMED = ("rows_checked", "rows_backfilled", "unindexable", "corrupt", "backoffs")


def describe_exit(returncode: int) -> str:
    """``killed by SIGKILL`` or ``exit status 1``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def forwarded_options(ctx: click.Context, skip: set[str]) -> list[str]:
    """The options given to this command (not their defaults), as command-line words,
    except those named in ``skip``: what each worker runs with."""
    words: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if not isinstance(param, click.Option) or name is None or name in skip:
            continue
        if ctx.get_parameter_source(name) in (None, click.core.ParameterSource.DEFAULT):
            continue
        value = ctx.params[name]
        opt = max(param.opts, key=len)
        if param.is_flag:
            flags = param.opts if value else param.secondary_opts
            words += [max(flags, key=len)] if flags else []
        elif param.multiple:
            for item in value:
                words += [opt, str(item)]
        else:
            words += [opt, str(value)]
    return words


@dataclass
class _Worker:
    """One part's worker process and its history."""

    part: int  # k of (k, n)
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    start_at: float = 0.0  # when to start it (again)
    done: bool = False
    failed: str | None = None  # why it was given up
    rate: float = 0.0  # rows/s of its last run that finished
    figures: Counter[str] = field(default_factory=Counter)
    held: dict[str, float] = field(default_factory=dict)  # HELD, over its runs


class Supervisor:
    """Runs the N parts of one backfill as worker processes (see the module docstring).

    ``args(k)`` is the worker's command line after the program (``--part`` included).
    """

    def __init__(
        self,
        store: DataStore,
        index: str,
        jobs: int,
        args: Callable[[int], list[str]],
        *,
        env: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        shutdown: Shutdown | None = None,
        restarts: int = RESTARTS,
        restart_delay: float = 1.0,
        poll: float = 0.2,
    ) -> None:
        self.store = store
        self.index = index
        self.jobs = jobs
        self.args = args
        self.env = dict(os.environ if env is None else env)
        self.progress = progress or Progress(quiet=True)
        self.shutdown = shutdown or Shutdown()
        self.restarts = restarts
        self.restart_delay = restart_delay
        self.poll = poll
        self.workers = [_Worker(k) for k in range(jobs)]
        self.state: IndexState | None = None
        self._spans: dict[int, Span] = {}  # shard -> its added_id range at the start
        self._shards = 0  # logical shards
        self._started = time.monotonic()
        self._stopping = False
        self._shown = float("-inf")
        self._seen = (0, 0)  # (rows, shards done) in the checkpoints, as last read

    # -- the run -------------------------------------------------------------------------

    def run(self) -> IndexState:
        """Run every part to its end; the index state afterwards."""
        topo = self.store.cluster.refresh()
        info = topo.indexes.get(self.index)
        if info is None:
            known = ", ".join(sorted(topo.indexes)) or "none"
            raise IndexDefinitionError(f"no index named {self.index!r} (indexes: {known})")
        if info.state == IndexState.READY:
            log.info("index %r is already ready: nothing to backfill", self.index)
            self.state = IndexState.READY
            return self.state
        if info.state != IndexState.BUILDING:
            raise CatalogError(
                f"index {self.index!r} is {info.state}: only a building index can be backfilled"
            )
        reopen(Runtime(self.store, shutdown=self.shutdown), self.index)  # before any part
        self._shards = topo.n_shards
        # an unavailable server's shards are left out (their part's worker waits)
        self._spans = added_ranges(self.store, topo, partial=True)
        try:
            while self._step():
                time.sleep(self.poll)
        finally:
            self._stop_all()
            self._shown = float("-inf")
            self._show()  # the last figures, which close() shows
            self.progress.close()
        self.state = self.store.cluster.refresh().indexes[self.index].state
        return self.state

    def _step(self) -> bool:
        """Start, watch and restart workers once; whether any is still to wait for."""
        now = time.monotonic()
        if self.shutdown.requested and not self._stopping:
            self._stopping = True
            for w in self.workers:
                if w.proc is not None and w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGTERM)
        busy = False
        for w in self.workers:
            if w.proc is not None:
                code = w.proc.poll()
                if code is None:
                    busy = True
                    continue
                self._ended(w, code)
            if not (w.done or w.failed or self._stopping):
                busy = True
                if now >= w.start_at:
                    self._start(w)
        self._show()
        return busy

    def _start(self, w: _Worker) -> None:
        w.proc = subprocess.Popen(
            [sys.executable, "-m", "schemaless.cleaner.main", *self.args(w.part)],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # the supervisor prints the one summary
            start_new_session=True,  # Ctrl-C reaches the supervisor, which passes it on
        )
        log.debug("part %s: worker pid %d", self._part(w), w.proc.pid)

    def _ended(self, w: _Worker, code: int) -> None:
        """Account for a worker's end: done, stopped, or died (restart or give up)."""
        assert w.proc is not None
        pid, w.proc = w.proc.pid, None
        self._collect(w, pid, finished=code == 0)
        if code == 0 and (self._stopping or self._part_done(w)):
            w.done = not self._stopping
            return
        ended = describe_exit(code) if code else "stopped before its part was done"
        what = f"part {self._part(w)} (pid {pid}) {ended}"
        if self._stopping:
            log.warning("%s while stopping", what)
        elif w.restarts < self.restarts:
            w.restarts += 1
            delay = self.restart_delay * 2 ** (w.restarts - 1)
            log.warning(
                "%s; starting it again in %gs (restart %d of %d)",
                what,
                delay,
                w.restarts,
                self.restarts,
            )
            w.start_at = time.monotonic() + delay
        else:
            w.failed = f"{ended} after {w.restarts} restarts"
            log.error("%s; given up after %d restarts", what, w.restarts)

    def _part_done(self, w: _Worker) -> bool:
        """Whether the checkpoints say every shard of a worker's part is done, and no
        deferral of its shards is left."""
        try:
            saved = self.checkpoints()
            deferred = Deferrals(self.store.cluster.catalog).of(self.index)
        except SchemalessError as exc:  # unknown: starting it again finds out
            log.warning("part %s: checkpoints not read: %s", self._part(w), exc)
            return False
        shards = range(w.part, self._shards, self.jobs)
        left = any(d.source % self.jobs == w.part for d in deferred)
        return not left and all(saved.get(s, (0, False, 0))[1] for s in shards)

    def _collect(self, w: _Worker, pid: int, *, finished: bool) -> None:
        """Add a run's figures, as its last heartbeat reported them."""
        name = backfill_name(self.index, (w.part, self.jobs))
        try:
            _, figures = self.store.cluster.catalog.statuses().get(name, (0, {}))
        except SchemalessError as exc:
            log.warning("part %s: figures not read: %s", self._part(w), exc)
            return
        if figures.get("pid") != pid:  # died before its first heartbeat
            return
        w.figures.update({k: int(figures.get(k) or 0) for k in _SUMMED})
        for k in HELD:
            w.held[k] = w.held.get(k, 0.0) + float(figures.get(k) or 0.0)
        if finished:
            w.rate = float(figures.get("rows_per_s") or 0.0)

    def _stop_all(self) -> None:
        """On the way out (after an error here): SIGTERM to the workers, then wait."""
        running = [w for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for w in running:
            assert w.proc is not None
            if not self._stopping:
                w.proc.send_signal(signal.SIGTERM)
        self._stopping = self._stopping or bool(running)
        for w in running:
            assert w.proc is not None
            self._ended(w, w.proc.wait())

    # -- reporting -----------------------------------------------------------------------

    def checkpoints(self) -> dict[int, tuple[int, bool, int]]:
        """``shard -> (position, done, rows)``: the backfill's checkpoints, every part."""
        return self.store.cluster.catalog.checkpoints(backfill_job(self.index))

    def _show(self) -> None:
        """The progress line (the checkpoints read at most once a second)."""
        now = time.monotonic()
        if now - self._shown < 1.0:
            return
        self._shown = now
        try:
            saved = self.checkpoints()
        except SchemalessError as exc:  # the workers wait for the catalog: so do we
            log.debug("progress not read: %s", exc)
            return
        rows = left = finished = 0
        for shard in range(self._shards):
            position, done, n = saved.get(shard, (0, False, 0))
            rows += n
            finished += done
            if not done and shard in self._spans:
                left += self._spans[shard].left(position, n)
        self._seen = (rows, finished)
        self.progress.update(self.index, rows, rows + left, finished, self._shards)

    def _part(self, w: _Worker) -> str:
        return f"{w.part + 1}/{self.jobs}"

    @property
    def failed(self) -> list[str]:
        """``part K/N: why`` of each part given up."""
        return [f"part {self._part(w)}: {w.failed}" for w in self.workers if w.failed]

    def summary(self) -> str:
        """One line for the whole backfill: the figures of this command's runs as the
        workers last reported them (a killed run's last few seconds are missing), then
        the checkpoints of every part and run (exact)."""
        f: Counter[str] = Counter()
        for w in self.workers:
            f.update(w.figures)
        elapsed = time.monotonic() - self._started
        parts = [
            f"{backfill_job(self.index)} ({self.jobs} jobs): {self.state} after {elapsed:.1f}s",
            f"rows checked {f['rows_checked']:,}",
            f"rows backfilled {f['rows_backfilled']:,}",
            f"unindexable {f['unindexable']:,}",
            f"corrupt {f['corrupt']:,}",
            f"restarts {sum(w.restarts for w in self.workers)}",
        ]
        rate = sum(w.rate for w in self.workers)
        if rate > 0:
            parts.append(f"{rate:,.0f} rows/s")
        held = held_text({k: sum(w.held.get(k, 0.0) for w in self.workers) for k in HELD})
        if held:
            parts.append("workers " + held)  # seconds summed over the workers
        rows, finished = self._seen
        return ", ".join(parts) + (
            f"; checkpoints: {rows:,} rows, shards {finished}/{self._shards} done"
        )
