"""Entity ids: 16 bytes, normally UUID version 7 (RFC 9562), so new ids sort by time.

Layout of :func:`new_id`: 48-bit Unix milliseconds, version 7, a 12-bit counter that
orders ids made in the same millisecond, variant ``10``, 62 random bits.  Within a
process ids are strictly increasing: the counter carries into the millisecond field
when it overflows, and a clock that steps back is ignored until it catches up.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from time import time_ns

from .errors import InvalidId

__all__ = ["id_hex", "new_id", "parse_id", "to_id"]

_COUNTER_MAX = 0xFFF
_RANDOM_MASK = (1 << 62) - 1
_VERSION_7 = 7 << 76
_VARIANT = 0b10 << 62
_HEX = re.compile(r"[0-9a-fA-F]{32}|[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_SHOW = 40

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def _after_fork() -> None:
    """A child must not inherit a lock that another thread of the parent held."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def new_id() -> bytes:
    """A fresh 16-byte UUIDv7, greater than every id this process made before."""
    global _last_ms, _counter
    now = time_ns() // 1_000_000
    with _lock:
        if now > _last_ms:
            _last_ms, _counter = now, 0
        elif _counter < _COUNTER_MAX:
            _counter += 1
        else:
            _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    rand = int.from_bytes(os.urandom(8), "big") & _RANDOM_MASK
    return ((ms << 80) | _VERSION_7 | (counter << 64) | _VARIANT | rand).to_bytes(16, "big")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 3] + "..."


def to_id(value: object) -> bytes:
    """``value`` as 16 id bytes: ``bytes`` of length 16 or a ``uuid.UUID``."""
    if isinstance(value, bytes) and len(value) == 16:
        return bytes(value)
    if isinstance(value, uuid.UUID):
        return value.bytes
    kind = type(value).__qualname__
    try:
        length = f" of length {len(value)}"  # type: ignore[arg-type]
    except TypeError:
        length = ""
    hint = "; use parse_id() for hex text" if isinstance(value, str) else ""
    raise InvalidId(
        f"entity id must be 16 bytes or uuid.UUID, got {kind}{length}: {_show(value)}{hint}"
    )


def id_hex(value: bytes | uuid.UUID) -> str:
    """The 32 lowercase hex characters of an id."""
    return to_id(value).hex()


def parse_id(text: str) -> bytes:
    """Id bytes from 32 hex characters or the 36-character hyphenated UUID form."""
    if not isinstance(text, str) or not _HEX.fullmatch(text):
        raise InvalidId(
            f"an id in text must be 32 hex characters or the 36-character UUID form, "
            f"got {_show(text)}"
        )
    return bytes.fromhex(text.replace("-", ""))
