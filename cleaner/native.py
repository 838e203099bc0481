"""The Cleaner's C path, ``rows`` (cleaner/_rows.c, built with the package where a C
compiler is), or None: the Python path then does all of its work, with the same results."""

from __future__ import annotations

__all__ = ["rows"]

try:
    from . import _rows as rows
except ImportError:  # installed without a C compiler
    rows = None  # type: ignore[assignment]
