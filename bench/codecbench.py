"""Codec: schemaless bodies against FriendFeed's pickle + zlib, on FriendFeed-like entities.

FriendFeed stored ``zlib.compress(pickle.dumps(entity))`` (pickle protocol 2, zlib level
6).  Under Python 3, protocol 2 pickles ``bytes`` through ``_codecs.encode(str,
'latin1')``, which inflates the three 16-byte ids; the highest protocol is reported too,
so the comparison can be read either way.
"""

from __future__ import annotations

import pickle
import time
import zlib
from collections.abc import Callable
from typing import Any

from schemaless.codec import Codec, train_dictionary

from .data import Dataset

__all__ = ["codec_bench"]


def _pass(fn: Callable[[Any], Any], items: list[Any]) -> float:
    """Seconds per call, one pass over ``items``."""
    t0 = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - t0) / len(items)


def _measure(
    formats: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]],
    entities: list[dict[str, Any]],
    min_seconds: float,
) -> list[dict[str, Any]]:
    """Each format's size and best encode/decode time per entity.  The formats take
    turns, pass after pass, so a slow moment of a shared machine hits them all alike."""
    bodies = {name: [enc(e) for e in entities] for name, (enc, _) in formats.items()}
    for name, (_, dec) in formats.items():
        for entity, body in zip(entities[:50], bodies[name][:50], strict=True):
            assert dec(body) == entity, f"{name}: round trip changed the entity"
    best = {name: [float("inf"), float("inf")] for name in formats}
    started, passes = time.perf_counter(), 0
    while passes < 5 or time.perf_counter() - started < min_seconds * len(formats):
        for name, (enc, dec) in formats.items():
            best[name][0] = min(best[name][0], _pass(enc, entities))
            best[name][1] = min(best[name][1], _pass(dec, bodies[name]))
        passes += 1
    return [
        {
            "format": name,
            "bytes_mean": round(sum(map(len, bodies[name])) / len(entities), 1),
            "encode_us": round(enc_s * 1e6, 3),
            "decode_us": round(dec_s * 1e6, 3),
            "round_trip_us": round((enc_s + dec_s) * 1e6, 3),
        }
        for name, (enc_s, dec_s) in best.items()
    ]


def codec_bench(n: int = 5000, train: int = 2000, min_seconds: float = 0.3) -> dict[str, Any]:
    """Sizes and speeds of each format, and schemaless's ratios against pickle2 + zlib."""
    ds = Dataset(max(n, train) * 2)
    entities = [ds.entity(i) for i in range(n)]
    training = [ds.entity(i) for i in range(n, n + train)]  # held out from the measured set

    plain = Codec()
    dictionary = train_dictionary(training)
    with_dict = Codec()
    with_dict.add_dictionary(1, dictionary)
    with_dict.use_dictionary(1)

    formats = _measure(
        {
            "pickle2+zlib6": (
                lambda e: zlib.compress(pickle.dumps(e, protocol=2), 6),
                lambda b: pickle.loads(zlib.decompress(b)),
            ),
            f"pickle{pickle.HIGHEST_PROTOCOL}+zlib6": (
                lambda e: zlib.compress(pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL), 6),
                lambda b: pickle.loads(zlib.decompress(b)),
            ),
            "schemaless": (plain.encode, plain.decode),
            "schemaless+dict": (with_dict.encode, with_dict.decode),
        },
        entities,
        min_seconds,
    )
    base = formats[0]
    for f in formats:
        f["size_vs_pickle2"] = round(f["bytes_mean"] / base["bytes_mean"], 3)
        f["speedup_vs_pickle2"] = round(base["round_trip_us"] / f["round_trip_us"], 2)
    return {
        "entities": n,
        "dictionary_samples": train,
        "dictionary_bytes": len(dictionary),
        "formats": formats,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(codec_bench(), indent=2))
