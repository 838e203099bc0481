"""The canonical, order-preserving encoding of a scalar (:func:`key_encode`).

It is the column value of untyped (``auto``) index properties and the bytes hashed for
placement: within one type, bytewise order of encodings equals Python's order of values.
"""

from __future__ import annotations

import math
import struct
import uuid
from functools import partial

__all__ = ["INT_MAX", "INT_MIN", "check_finite", "key_decode", "key_encode", "utf8"]

TAG_BOOL = b"\x01"
TAG_INT = b"\x02"
TAG_FLOAT = b"\x03"
TAG_STR = b"\x04"
TAG_BYTES = b"\x05"

INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
_INT_BIAS = 2**63
_SIGN_BIT = 1 << 63
_ALL_BITS = (1 << 64) - 1
_pack_double = struct.Struct(">d").pack
_pack_int = partial(struct.Struct(">BQ").pack, TAG_INT[0])  # tag and biased value
_unpack_u64 = struct.Struct(">Q").unpack


def _encode_int(value: int) -> bytes:
    if not INT_MIN <= value <= INT_MAX:
        raise ValueError("int is outside the 64-bit signed range (-2**63 .. 2**63-1)")
    return _pack_int(value + _INT_BIAS)  # one call: the backfill places every row with it


def check_finite(value: float) -> None:
    if value != value:
        raise ValueError("NaN cannot be indexed")
    if value in (math.inf, -math.inf):
        raise ValueError(f"{value} cannot be indexed")


def _encode_float(value: float) -> bytes:
    check_finite(value)
    if value == 0.0:
        value = 0.0  # -0.0 and 0.0 are the same key
    bits: int = _unpack_u64(_pack_double(value))[0]
    bits = bits ^ _ALL_BITS if bits & _SIGN_BIT else bits | _SIGN_BIT
    return TAG_FLOAT + bits.to_bytes(8, "big")


def utf8(value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("str contains a lone surrogate (not valid UTF-8)") from None


def key_encode(value: object) -> bytes:
    """The canonical, order-preserving bytes of a scalar (tag byte, then payload).

    Within one type, bytewise order of encodings equals Python's order of values.
    A ``uuid.UUID`` encodes as its 16 bytes.  Raises TypeError for an unsupported
    type and ValueError for an unsupported value (NaN, inf, out-of-range int, lone
    surrogate).
    """
    t = type(value)
    if t is str:
        return TAG_STR + utf8(value)  # type: ignore[arg-type]
    if t is int:
        return _encode_int(value)  # type: ignore[arg-type]
    if t is bytes:
        return TAG_BYTES + value  # type: ignore[operator]
    if t is bool:
        return TAG_BOOL + (b"\x01" if value else b"\x00")
    if t is float:
        return _encode_float(value)  # type: ignore[arg-type]
    # subclasses (IntEnum, str enums, ...) and uuid.UUID
    if isinstance(value, bool):
        return TAG_BOOL + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return _encode_int(int(value))
    if isinstance(value, float):
        return _encode_float(float(value))
    if isinstance(value, str):
        return TAG_STR + utf8(str(value))
    if isinstance(value, bytes):
        return TAG_BYTES + bytes(value)
    if isinstance(value, uuid.UUID):
        return TAG_BYTES + value.bytes
    raise TypeError(f"a {t.__name__} cannot be indexed (use str, bytes, int, float, bool, UUID)")


_unpack_double = struct.Struct(">d").unpack


def key_decode(encoded: bytes) -> object:
    """The scalar of :func:`key_encode` bytes (a UUID comes back as its 16 bytes)."""
    tag, payload = encoded[:1], bytes(encoded[1:])
    if tag == TAG_STR:
        return payload.decode("utf-8")
    if tag == TAG_BYTES:
        return payload
    if tag == TAG_BOOL:
        return payload == b"\x01"
    bits = int.from_bytes(payload, "big")
    if tag == TAG_INT:
        return bits - _INT_BIAS
    if tag == TAG_FLOAT:
        bits = bits ^ _SIGN_BIT if bits & _SIGN_BIT else bits ^ _ALL_BITS
        return float(_unpack_double(bits.to_bytes(8, "big"))[0])
    raise ValueError(f"not a key_encode value: tag {tag!r}")
