"""Entity bodies: msgpack + zstd behind a version header.

A body is ``version, compression, [dictionary id], payload``::

    01 00 <msgpack>                      raw: payloads under 64 bytes, or when zstd
                                         would not save an eighth of them
    01 01 <zstd frame>                   plain zstd
    01 02 <dict id: u32 BE> <zstd frame> zstd with a trained dictionary (the frame
                                         omits zstd's own dictionary id)

Every zstd frame declares its content size; :meth:`Codec.decode` checks it against
``max_decoded_bytes`` before it allocates anything (decompression-bomb defence).

Values: ``dict`` (str keys), ``list``, ``str``, ``bytes``, ``int`` in
[-2**63, 2**64-1], ``float`` (not NaN), ``bool``, ``None``, ``uuid.UUID`` (msgpack
ext 1, 16 bytes) and aware ``datetime.datetime`` (ext 2: int64 microseconds since
the epoch + int32 UTC offset in seconds, big-endian; decoded with a fixed-offset
``datetime.timezone``, equal to the original).  Whatever :meth:`Codec.encode`
accepts, :meth:`Codec.decode` returns equal (``==``); subclasses come back as their
base type.  One caveat is Python's, not ours: an aware datetime whose zone makes its
wall time ambiguous (a ``zoneinfo`` time in a DST fold or gap) never compares equal
to any datetime in another zone, so it comes back as the same instant but ``!=``.

Decoding checks structure (header, frame, trailing bytes, msgpack syntax, extension
payloads, a map at the top) but does not re-validate every value: a foreign body may
still carry bytes map keys, or a msgpack timestamp (ext -1, decoded as an aware UTC
datetime); bodies written by :meth:`Codec.encode` never do.

Threads: one :class:`Codec` serves them all; each thread lazily gets its own packer
and zstd contexts (those are not thread-safe), one per dictionary.
"""

from __future__ import annotations

import functools
import struct
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import msgpack
import zstandard
from msgpack import unpackb as _unpackb
from zstandard import frame_content_size as _frame_content_size

from . import forking
from .errors import CorruptEntity, EntityTooLarge, InvalidEntity

__all__ = ["MAX_DEPTH", "Codec", "train_dictionary"]

#: Containers nest at most this deep; the entity itself is level 1.
MAX_DEPTH = 32

_VERSION = 0x01
_RAW = 0x00
_ZSTD = 0x01
_ZSTD_DICT = 0x02
_HEAD_RAW = bytes((_VERSION, _RAW))
_HEAD_ZSTD = bytes((_VERSION, _ZSTD))
_HEAD_ZSTD_DICT = bytes((_VERSION, _ZSTD_DICT))
_MIN_COMPRESS = 64  # below this, zstd's frame overhead outweighs any gain
# A frame is kept only if it saves at least 1/_MIN_SAVING of the raw body: decoding a
# small frame costs about ten times a raw one (3.2 against 0.3 us for a 256-byte
# entity), every read and every backfill pays it, and a few bytes saved do not.
# PostgreSQL's TOAST keeps a compressed value only if it saves 25% (pglz's
# min_comp_rate); an eighth keeps what a trained dictionary gives (about half).
_MIN_SAVING = 8

_EXT_UUID = 1
_EXT_DATETIME = 2
_DATETIME = struct.Struct(">qi")
_EPOCH = datetime(1970, 1, 1)  # naive: local wall times are measured from it
_MICROSECOND = timedelta(microseconds=1)
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_DICT_ID_MAX = 2**32 - 1
_SHOW = 40  # at most this many characters of a foreign value in a message

_HINTS: dict[type, str] = {
    tuple: "tuple would come back as a list; use a list",
    set: "set is not supported; use a list",
    frozenset: "frozenset is not supported; use a list",
    bytearray: "bytearray is not supported; use bytes",
    memoryview: "memoryview is not supported; use bytes",
    Decimal: "Decimal is not supported; use a str or a float",
    date: "date is not supported; use an aware datetime or an ISO 8601 str",
    time: "time is not supported; use a str or an int",
    timedelta: "timedelta is not supported; use an int (e.g. seconds)",
}
_SUPPORTED = "dict, list, str, bytes, int, float, bool, None, uuid.UUID, aware datetime"


class _Refusal(Exception):
    """Raised inside the validation walk; the path is collected as it unwinds."""

    def __init__(self, reason: str, path: list[str | int]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path  # innermost first

    def message(self) -> str:
        return _at(reversed(self.path)) + self.reason


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 3] + "..."


def _at(path: Iterable[str | int]) -> str:
    """``"entity property 'tags'[3]: "`` for the path ``['tags', 3]``."""
    parts = [f"[{p}]" if type(p) is int else f"[{_show(p)}]" for p in path]
    if not parts:
        return "entity: "
    return f"entity property {parts[0][1:-1]}{''.join(parts[1:])}: "


# -- validation ----------------------------------------------------------------------


def _check_dict(mapping: dict[Any, Any], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _Refusal(f"nesting deeper than {MAX_DEPTH} levels", [])
    for key, value in mapping.items():
        if type(key) is not str and not isinstance(key, str):
            raise _Refusal(
                f"key {_show(key)} is a {type(key).__name__}; property names must be str", []
            )
        t = type(value)
        if t is str or t is int or t is bytes or t is bool or value is None:
            continue
        try:
            if t is float:
                if value != value:
                    raise _Refusal("NaN is not supported (it is not equal to itself)", [])
            else:
                _check_other(value, depth)
        except _Refusal as refusal:
            refusal.path.append(key)
            raise


def _check_list(items: list[Any], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _Refusal(f"nesting deeper than {MAX_DEPTH} levels", [])
    for index, value in enumerate(items):
        t = type(value)
        if t is str or t is int or t is bytes or t is bool or value is None:
            continue
        try:
            if t is float:
                if value != value:
                    raise _Refusal("NaN is not supported (it is not equal to itself)", [])
            else:
                _check_other(value, depth)
        except _Refusal as refusal:
            refusal.path.append(index)
            raise


def _check_other(value: object, depth: int) -> None:
    """Everything but the exact scalar types, which the loops above let through."""
    if isinstance(value, dict):
        _check_dict(value, depth + 1)
    elif isinstance(value, list):
        _check_list(value, depth + 1)
    elif isinstance(value, datetime):
        offset = value.utcoffset()
        if offset is None:
            raise _Refusal(
                "naive datetime (no tzinfo) is ambiguous; use an aware datetime, "
                "e.g. datetime.now(timezone.utc)",
                [],
            )
        if offset.microseconds:
            raise _Refusal(f"datetime UTC offset {offset} is not a whole number of seconds", [])
    elif isinstance(value, float):
        if value != value:
            raise _Refusal("NaN is not supported (it is not equal to itself)", [])
    elif not isinstance(value, str | bytes | int | uuid.UUID):
        hint = _HINTS.get(type(value))
        if hint is None:
            hint = f"{type(value).__qualname__} is not supported (supported: {_SUPPORTED})"
        raise _Refusal(hint, [])


def _locate(value: object, bad: Callable[[object], bool], path: list[str | int]) -> bool:
    """Find the first key or value for which ``bad`` holds; its path is left in ``path``."""
    if isinstance(value, dict):
        for key, item in value.items():
            path.append(key)
            if bad(key) or _locate(item, bad, path):
                return True
            path.pop()
        return False
    if isinstance(value, list):
        for index, item in enumerate(value):
            path.append(index)
            if _locate(item, bad, path):
                return True
            path.pop()
        return False
    return bad(value)


def _has_surrogate(value: object) -> bool:
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return True
    return False


def _beyond_64_bits(value: object) -> bool:
    return isinstance(value, int) and not _INT_MIN <= value <= _INT_MAX


def _pack_error(entity: dict[str, Any], error: Exception) -> InvalidEntity:
    """Explain a value the packer refused after the walk let it through."""
    path: list[str | int] = []
    if isinstance(error, UnicodeEncodeError) and _locate(entity, _has_surrogate, path):
        reason = "str contains a lone surrogate and cannot be encoded as UTF-8"
    elif _locate(entity, _beyond_64_bits, path):
        reason = "ints beyond 64 bits are not supported (range -2**63 .. 2**64-1)"
    else:
        path, reason = [], f"cannot be serialised: {error}"
    return InvalidEntity(_at(path) + reason)


# -- msgpack extensions ---------------------------------------------------------------


def _default(value: object) -> msgpack.ExtType:
    """Pack the extension types (already validated by the walk).

    The packer also calls this for an int beyond 64 bits: OverflowError then.
    """
    if isinstance(value, uuid.UUID):
        return msgpack.ExtType(_EXT_UUID, value.bytes)
    if isinstance(value, datetime):
        offset = value.utcoffset()
        assert offset is not None
        seconds = offset.days * 86400 + offset.seconds
        local = (value.replace(tzinfo=None) - _EPOCH) // _MICROSECOND
        return msgpack.ExtType(_EXT_DATETIME, _DATETIME.pack(local - seconds * 1_000_000, seconds))
    if isinstance(value, int):
        raise OverflowError("int beyond 64 bits")
    raise TypeError(f"cannot serialise {type(value).__qualname__}")


@functools.lru_cache(maxsize=256)
def _zone(seconds: int) -> timezone:
    return timezone(timedelta(seconds=seconds))


def _ext_hook(code: int, data: bytes) -> object:
    if code == _EXT_UUID:
        if len(data) != 16:
            raise CorruptEntity(f"uuid extension of {len(data)} bytes, expected 16")
        return uuid.UUID(bytes=data)
    if code == _EXT_DATETIME:
        if len(data) != _DATETIME.size:
            raise CorruptEntity(f"datetime extension of {len(data)} bytes, expected 12")
        micros, seconds = _DATETIME.unpack(data)
        try:
            local = _EPOCH + timedelta(microseconds=micros + seconds * 1_000_000)
            return local.replace(tzinfo=_zone(seconds))
        except (OverflowError, ValueError) as exc:
            raise CorruptEntity(f"datetime extension out of range: {exc}") from None
    raise CorruptEntity(f"unknown msgpack extension type {code}")


# -- the codec ------------------------------------------------------------------------


class _ThreadState(threading.local):
    """One thread's packer and zstd contexts (none of them is thread-safe)."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(default=_default, use_bin_type=True, autoreset=True)
        self.compressors: dict[int | None, zstandard.ZstdCompressor] = {}
        self.decompressors: dict[bytes, zstandard.ZstdDecompressor] = {}


def _serialise(entity: Mapping[str, Any], packer: Any) -> bytes:
    """Validate one entity and msgpack it."""
    if type(entity) is not dict:
        if not isinstance(entity, Mapping):
            raise InvalidEntity(
                f"an entity must be a dict of property names to values, "
                f"got {type(entity).__qualname__}"
            )
        entity = dict(entity)
    try:
        _check_dict(entity, 1)
    except _Refusal as refusal:
        raise InvalidEntity(refusal.message()) from None
    try:
        payload: bytes = packer.pack(entity)
    except (UnicodeEncodeError, OverflowError) as exc:
        raise _pack_error(entity, exc) from None
    return payload


class Codec:
    """Encodes entity dicts into bodies and back; one instance serves all threads.

    ``max_body_bytes`` bounds an encoded body (lower it to the server's
    ``max_allowed_packet`` minus overhead); ``max_decoded_bytes`` bounds a payload
    on both sides, so whatever encodes also decodes; ``level`` is the zstd level.
    """

    def __init__(
        self,
        *,
        max_body_bytes: int = 4 * 1024 * 1024,
        max_decoded_bytes: int = 64 * 1024 * 1024,
        level: int = 3,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.max_decoded_bytes = max_decoded_bytes
        self._level = level
        self._dictionaries: dict[int, bytes] = {}
        self._dictionaries_lock = threading.Lock()
        self._current: tuple[int | None, bytes] = (None, _HEAD_ZSTD)
        self._tls = _ThreadState()
        forking.register(self)

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (a parent thread may have held it)."""
        self._dictionaries_lock = threading.Lock()

    # -- dictionaries

    def add_dictionary(self, dict_id: int, data: bytes) -> None:
        """Make a dictionary known for decoding (and for :meth:`use_dictionary`).

        Ids are permanent: adding an id again with the same data does nothing, with
        other data is refused (ValueError), as is data zstd cannot use.
        """
        if type(dict_id) is not int or not 1 <= dict_id <= _DICT_ID_MAX:
            raise ValueError(f"dictionary id must be an int in 1 .. 2**32-1, got {dict_id!r}")
        data = bytes(data)
        if len(data) < 8:
            raise ValueError(f"dictionary {dict_id} has {len(data)} bytes; zstd needs 8 or more")
        with self._dictionaries_lock:
            known = self._dictionaries.get(dict_id)
            if known is not None:
                if known != data:
                    raise ValueError(f"dictionary id {dict_id} is already bound to other data")
                return
            try:
                zstandard.ZstdCompressionDict(data).precompute_compress(level=self._level)
            except zstandard.ZstdError as exc:
                raise ValueError(f"dictionary {dict_id} is not usable by zstd: {exc}") from None
            self._dictionaries[dict_id] = data

    def use_dictionary(self, dict_id: int | None) -> None:
        """Compress new bodies with this known dictionary (``None``: plain zstd)."""
        if dict_id is None:
            self._current = (None, _HEAD_ZSTD)
        elif dict_id in self._dictionaries:
            self._current = (dict_id, _HEAD_ZSTD_DICT + dict_id.to_bytes(4, "big"))
        else:
            raise ValueError(f"unknown dictionary id {dict_id!r}: add_dictionary() it first")

    def has_dictionary(self, dict_id: int) -> bool:
        """Whether :meth:`add_dictionary` has made this id known."""
        return dict_id in self._dictionaries

    def dictionary_id(self, body: bytes) -> int | None:
        """The dictionary a stored body names (``None``: none); CorruptEntity if bad."""
        if len(body) >= 2 and body[0] == _VERSION and body[1] in (_RAW, _ZSTD):
            return None
        if len(body) >= 6 and body[0] == _VERSION and body[1] == _ZSTD_DICT:
            return int.from_bytes(body[2:6], "big")
        raise CorruptEntity(_header_problem(body))

    # -- encode / decode

    def encode(self, entity: Mapping[str, Any]) -> bytes:
        """Validate and serialise an entity; InvalidEntity / EntityTooLarge if it can't be."""
        tls = self._tls
        payload = _serialise(entity, tls.packer)
        size = len(payload)
        if size > self.max_decoded_bytes:
            raise EntityTooLarge(
                f"entity serialises to {size} bytes, above max_decoded_bytes "
                f"{self.max_decoded_bytes}"
            )
        if size < _MIN_COMPRESS:
            body = _HEAD_RAW + payload
        else:
            dict_id, head = self._current
            compressor = tls.compressors.get(dict_id) or self._compressor(dict_id)
            frame = compressor.compress(payload)
            # a payload that zstd barely shrinks (or grows) is stored raw: cheaper to read
            raw = 2 + size
            kept = len(head) + len(frame) <= raw - raw // _MIN_SAVING
            body = head + frame if kept else _HEAD_RAW + payload
        if len(body) > self.max_body_bytes:
            raise EntityTooLarge(
                f"entity body is {len(body)} bytes encoded, above the limit of "
                f"{self.max_body_bytes} bytes"
            )
        return body

    def decode(self, body: bytes) -> dict[str, Any]:
        """Deserialise a body; CorruptEntity says what is wrong with it."""
        payload = body[2:] if body[:2] == _HEAD_RAW else self.payload(body)
        try:
            entity = _unpackb(payload, raw=False, ext_hook=_ext_hook, timestamp=3)
        except (ValueError, TypeError, OverflowError) as exc:
            raise CorruptEntity(f"invalid msgpack payload: {type(exc).__name__}: {exc}") from None
        if type(entity) is not dict:
            raise CorruptEntity(f"payload is a {type(entity).__name__}, not a map")
        return entity

    def payload(self, body: bytes) -> bytes:
        """A body's msgpack payload, decompressed and checked (not parsed);
        CorruptEntity says what is wrong with it."""
        head = body[:2]
        if head == _HEAD_RAW:
            return body[2:]
        # a thread's decompressors are keyed by header: 2 bytes, 6 with a dictionary id
        if head == _HEAD_ZSTD_DICT:
            key = body[:6]
            frame = body[6:]
        elif head == _HEAD_ZSTD:
            key = head
            frame = body[2:]
        else:
            raise CorruptEntity(_header_problem(body))
        decompressor = self._tls.decompressors.get(key) or self._decompressor(key)
        try:
            size = _frame_content_size(frame)
        except zstandard.ZstdError as exc:
            raise CorruptEntity(f"invalid zstd frame header: {exc}") from None
        if size < 0:
            raise CorruptEntity("zstd frame does not declare its content size")
        if size > self.max_decoded_bytes:
            raise CorruptEntity(
                f"zstd frame declares {size} bytes of content, above "
                f"max_decoded_bytes {self.max_decoded_bytes}"
            )
        try:
            # positional: max_output_size=0, read_across_frames=False,
            # allow_extra_data=False (keywords cost a measurable 0.3 us)
            payload: bytes = decompressor.decompress(frame, 0, False, False)
        except zstandard.ZstdError as exc:
            raise CorruptEntity(f"corrupt zstd frame: {exc}") from None
        return payload

    # -- internals

    def _zstd_dict(self, dict_id: int) -> zstandard.ZstdCompressionDict:
        """A fresh dictionary object: each thread gets its own (they cache C state)."""
        data = self._dictionaries.get(dict_id)
        if data is None:
            raise CorruptEntity(f"body names unknown dictionary id {dict_id}")
        return zstandard.ZstdCompressionDict(data)

    def _compressor(self, dict_id: int | None) -> zstandard.ZstdCompressor:
        if dict_id is None:
            compressor = zstandard.ZstdCompressor(level=self._level, write_content_size=True)
        else:
            zdict = self._zstd_dict(dict_id)
            zdict.precompute_compress(level=self._level)
            compressor = zstandard.ZstdCompressor(
                dict_data=zdict, write_content_size=True, write_dict_id=False
            )
        self._tls.compressors[dict_id] = compressor
        return compressor

    def _decompressor(self, key: bytes) -> zstandard.ZstdDecompressor:
        if key == _HEAD_ZSTD:
            decompressor = zstandard.ZstdDecompressor()
        elif len(key) == 6:
            dict_id = int.from_bytes(key[2:], "big")
            decompressor = zstandard.ZstdDecompressor(dict_data=self._zstd_dict(dict_id))
        else:
            raise CorruptEntity(_header_problem(key))
        self._tls.decompressors[key] = decompressor
        return decompressor


def _header_problem(body: bytes) -> str:
    if len(body) < 2:
        return f"body of {len(body)} bytes is too short for a header"
    if body[0] != _VERSION:
        return f"unknown body format version 0x{body[0]:02x}"
    if body[1] == _ZSTD_DICT:
        return f"body of {len(body)} bytes is too short for a dictionary id"
    return f"unknown compression 0x{body[1]:02x}"


def train_dictionary(samples: Iterable[Mapping[str, Any]], size: int = 16384) -> bytes:
    """A zstd dictionary of at most ``size`` bytes, trained on these entities' msgpack.

    Give it a few thousand representative entities; store the result with an id in
    the catalog, then :meth:`Codec.add_dictionary` and :meth:`Codec.use_dictionary`.
    """
    packer = msgpack.Packer(default=_default, use_bin_type=True, autoreset=True)
    payloads: list[bytes | bytearray | memoryview[int]] = []
    for number, entity in enumerate(samples):
        try:
            payloads.append(_serialise(entity, packer))
        except InvalidEntity as exc:
            raise InvalidEntity(f"sample {number}: {exc}") from None
    try:
        trained = zstandard.train_dictionary(size, payloads)
    except zstandard.ZstdError as exc:
        raise ValueError(
            f"cannot train a {size}-byte dictionary on {len(payloads)} samples "
            f"({sum(map(len, payloads))} bytes): {exc}; give more samples"
        ) from None
    return trained.as_bytes()
