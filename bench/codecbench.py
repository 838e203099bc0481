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


def _time_per_item(fn: Callable[[Any], Any], items: list[Any], min_seconds: float) -> float:
    """Seconds per call, best of several passes over ``items``."""
    best = float("inf")
    spent = 0.0
    passes = 0
    while spent < min_seconds or passes < 3:
        t0 = time.perf_counter()
        for item in items:
            fn(item)
        took = time.perf_counter() - t0
        best = min(best, took / len(items))
        spent += took
        passes += 1
    return best


def _measure(
    name: str,
    encode: Callable[[Any], bytes],
    decode: Callable[[bytes], Any],
    entities: list[dict[str, Any]],
    min_seconds: float,
) -> dict[str, Any]:
    bodies = [encode(e) for e in entities]
    for entity, body in zip(entities[:50], bodies[:50], strict=True):
        assert decode(body) == entity, f"{name}: round trip changed the entity"
    enc = _time_per_item(encode, entities, min_seconds)
    dec = _time_per_item(decode, bodies, min_seconds)
    return {
        "format": name,
        "bytes_mean": round(sum(map(len, bodies)) / len(bodies), 1),
        "encode_us": round(enc * 1e6, 3),
        "decode_us": round(dec * 1e6, 3),
        "round_trip_us": round((enc + dec) * 1e6, 3),
    }


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

    formats = [
        _measure(
            "pickle2+zlib6",
            lambda e: zlib.compress(pickle.dumps(e, protocol=2), 6),
            lambda b: pickle.loads(zlib.decompress(b)),
            entities,
            min_seconds,
        ),
        _measure(
            f"pickle{pickle.HIGHEST_PROTOCOL}+zlib6",
            lambda e: zlib.compress(pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL), 6),
            lambda b: pickle.loads(zlib.decompress(b)),
            entities,
            min_seconds,
        ),
        _measure("schemaless", plain.encode, plain.decode, entities, min_seconds),
        _measure(
            "schemaless+dict",
            with_dict.encode,
            with_dict.decode,
            entities,
            min_seconds,
        ),
    ]
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
