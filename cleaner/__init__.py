"""The Cleaner daemon: index backfill, orphan repair and verification.

Installed as ``schemaless.cleaner``; the ``cleaner`` command is ``main.main``::

    cleaner --index=by_link     # backfill a building index, then mark it ready
    cleaner --once              # one pass: recent changes, a full sweep, the purge
    cleaner verify --repair     # the oracle as an operator tool

``Cleaner`` runs the same jobs in-process (``backfill(name)``, ``run_once(now=...)``).
"""

from .daemon import Cleaner
from .runtime import Shutdown
from .verify import Diff, diff_indexes

__all__ = ["Cleaner", "Diff", "Shutdown", "diff_indexes"]
