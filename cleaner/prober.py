"""The canaries' probes, from a forked child in a session of its own.

A canary must time what a live client feels.  In the Cleaner's process it would also
time the Cleaner: a reply waits for the GIL while the lanes decode, and for a CPU
behind every other process when the Cleaner's priority is lowered (``--nice``, which
reaches its autogroup, cleaner/priority.py).  So the probes run in a child forked
for them (the library's objects start afresh in a child: schemaless/forking.py), in
a session, hence an autogroup, of its own at the default weight, one thread per
server.  Each probe is announced before it is sent and its sample after, one JSON
line each on a pipe, which a thread of the parent counts into its ``Canary``
(a probe in flight shows its age at once: a stopped server is seen before it
answers).  The child ends when the parent closes it, or dies (its next write fails).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from schemaless.errors import SchemalessError

from .canary import Canary, Sample

__all__ = ["ProbeProcess"]

log = logging.getLogger("schemaless.cleaner")

Send = Callable[[dict[str, Any]], None]


class ProbeProcess:
    """Probe every canary every ``interval`` seconds from a child process."""

    def __init__(self, canaries: Mapping[int, Canary], interval: float) -> None:
        self.canaries = dict(canaries)
        self.interval = interval
        self.pid: int | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        """Fork the child and start counting its samples."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the Cleaner's code
            try:
                os.close(read)
                self._child(write)
            finally:
                os._exit(0)
        os.close(write)
        self.pid = pid
        self._reader = threading.Thread(
            target=self._read, args=(read,), name="cleaner-canaries", daemon=True
        )
        self._reader.start()

    def close(self) -> None:
        """End the child; the reader ends with its pipe."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if self._reader is not None:
            self._reader.join()
            self._reader = None

    def _read(self, fd: int) -> None:
        """Count the child's lines until its end of the pipe closes."""
        with os.fdopen(fd, "rb") as pipe:
            for line in pipe:
                try:
                    self._count(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("throttle: canary line not understood: %s", exc)

    def _count(self, msg: dict[str, Any]) -> None:
        canary = self.canaries[int(msg["sid"])]
        if "began" in msg:
            canary.began(float(msg["began"]))
            return
        started, ended, status, lag = msg["sample"]
        canary.record(Sample(float(started), float(ended), status, lag))

    # -- in the child ------------------------------------------------------------------

    def _child(self, fd: int) -> None:
        """Probe every server in a thread of its own until a write fails."""
        os.setsid()  # an autogroup of its own: the priority of live traffic
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the Cleaner's flag-setters
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        lock = threading.Lock()
        gone = threading.Event()

        def send(msg: dict[str, Any]) -> None:
            data = json.dumps(msg).encode() + b"\n"
            with lock:
                try:
                    os.write(fd, data)
                except OSError:  # the parent is gone, or closed the pipe
                    gone.set()

        for sid, canary in self.canaries.items():
            thread = threading.Thread(target=self._probe, args=(sid, canary, send, gone))
            thread.daemon = True
            thread.start()
        gone.wait()

    def _probe(self, sid: int, canary: Canary, send: Send, gone: threading.Event) -> None:
        # This child's connection first, unannounced: a connect and login are not what
        # a live client's pooled query feels, and in the first windows, of a few probes
        # each, that one probe was their p90 (bench run CC: a breach before any batch).
        with contextlib.suppress(SchemalessError):
            canary.server.run("SELECT 1")
        while not gone.is_set():
            send({"sid": sid, "began": time.monotonic()})
            s = canary.measure()
            send({"sid": sid, "sample": [s.started, s.ended, s.status, s.lag]})
            gone.wait(self.interval)
