"""The Cleaner's C path, ``rows`` (cleaner/_rows.c, built with the package where a C
compiler is), or None: the Python path then does all of its work, with the same results.

``SCHEMALESS_NO_C=1`` in the environment turns the C path off (a process started with
it runs the Python path only): for an A/B of the two, or to rule the C path out."""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["rows"]


def _load() -> ModuleType | None:
    if os.environ.get("SCHEMALESS_NO_C", "") not in ("", "0"):
        return None
    try:
        from . import _rows
    except ImportError:  # installed without a C compiler
        return None
    return _rows


if TYPE_CHECKING:  # the stub's types (_rows.pyi); callers check for None
    from . import _rows as rows
else:
    rows = _load()
