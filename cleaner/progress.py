"""Progress: one updating line on a terminal, plain log lines every few seconds otherwise."""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

__all__ = ["Progress", "Task", "end_progress_lines", "format_duration"]

log = logging.getLogger("schemaless.cleaner")

#: The progress lines drawn on a terminal and not yet ended (under ``_DRAWN_LOCK``,
#: taken after a ``Progress``'s own lock, never before it).
_DRAWN: weakref.WeakSet[Progress] = weakref.WeakSet()
_DRAWN_LOCK = threading.Lock()


def end_progress_lines(record: logging.LogRecord) -> bool:
    """A logging filter for a terminal's handler: ends the progress line drawn there,
    so the record gets a line of its own (it is always let through)."""
    with _DRAWN_LOCK:
        drawn = list(_DRAWN)
    for progress in drawn:
        progress.end_line()
    return True


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class Task:
    """One job's progress: ``done`` of about ``total`` rows, shards finished."""

    label: str
    done: int = 0
    total: int | None = None
    shards_done: int = 0
    shards: int = 0
    started: float = 0.0
    base: int = 0  # rows done before this process started (resumed from a checkpoint)

    def rate(self, now: float) -> float:
        """Rows per second since this process started on the task."""
        elapsed = now - self.started
        return (self.done - self.base) / elapsed if elapsed > 0 else 0.0

    def line(self, now: float) -> str:
        """``by_link: 12,000/~20,000 rows, 5,400 rows/s, ETA 2s, shards 3/8``."""
        rate = self.rate(now)
        text = f"{self.label}: {self.done:,}"
        if self.total is not None:
            text += f"/~{max(self.total, self.done):,}"
        text += f" rows, {rate:,.0f} rows/s"
        if self.total is not None and rate > 0:
            text += f", ETA {format_duration(max(0, self.total - self.done) / rate)}"
        if self.shards:
            text += f", shards {self.shards_done}/{self.shards}"
        return text


class Progress:
    """Shows tasks: redraws one line on a terminal; logs a line every ``interval``
    seconds when the stream is not a terminal (or shows nothing if ``quiet``)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        interval: float = 5.0,
        quiet: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval if not self.tty else 0.2
        self.quiet = quiet
        self._clock = clock
        self._tasks: dict[str, Task] = {}
        #: a note shown after the tasks (the throttle's limit and reason), "" for none
        self.note: Callable[[], str] = lambda: ""
        self._last = float("-inf")
        self._width = 0
        self._lock = threading.RLock()  # a record logged while it is held ends the line

    def update(
        self,
        label: str,
        done: int,
        total: int | None = None,
        shards_done: int = 0,
        shards: int = 0,
        *,
        force: bool = False,
    ) -> None:
        """Record a task's figures; redraw or log if it is time (or ``force``)."""
        now = self._clock()
        with self._lock:
            task = self._tasks.get(label)
            if task is None:
                task = self._tasks[label] = Task(label, started=now, base=done)
            task.done, task.total = done, total
            task.shards_done, task.shards = shards_done, shards
        self.show(force)

    def tasks(self) -> list[Task]:
        """The tasks seen so far."""
        with self._lock:
            return list(self._tasks.values())

    def show(self, force: bool = False) -> None:
        """Redraw (terminal) or log (otherwise), at most every ``interval`` seconds."""
        now = self._clock()
        with self._lock:
            if self.quiet or not self._tasks or (not force and now - self._last < self.interval):
                return
            self._last = now
            lines = [t.line(now) for t in self._tasks.values()]
            note = self.note()
            text = " | ".join([*lines, note] if note else lines)
            if self.tty:
                pad = " " * max(0, self._width - len(text))
                self.stream.write("\r" + text + pad)
                self.stream.flush()
                self._width = len(text)
                with _DRAWN_LOCK:
                    _DRAWN.add(self)
            else:
                log.info("progress: %s", text)

    def message(self, text: str) -> None:
        """A one-off line (e.g. waiting out the grace period)."""
        if self.quiet:
            return
        with self._lock:
            if self.tty:
                self._end_line()
                self.stream.write(text + "\n")
                self.stream.flush()
            else:
                log.info("%s", text)

    def close(self) -> None:
        """Show the final figures and end the line."""
        self.show(force=True)
        self.end_line()

    def end_line(self) -> None:
        """End the line drawn on the terminal, if any (the next draws a new one)."""
        with self._lock:
            self._end_line()

    def _end_line(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
            with _DRAWN_LOCK:
                _DRAWN.discard(self)
