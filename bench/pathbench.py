"""``python -m bench.pathbench``: a path index against a top-level one (issue 40).

Two datastores on one local cluster (``--dir``), the same documents in each: one
indexes ``author.id`` (a path into a nested dict), the other ``author_id`` (the same
value at the top level), both with ``published``.  Interleaved in one run
(``run_interleaved``): a put of a new document, and the newest page of 20 of one
author (about ``--per-author`` documents each).  Then, on ``--backfill`` documents
stored before the index is declared, the Cleaner's backfill of each
(``Cleaner.backfill``, in this process), alternated ``--rounds`` times.  Prints one
JSON object: the path side's ratios and the samples.
Example: ``python -m bench.pathbench --dir .bench-cluster --seconds 4``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from schemaless import DataStore, Index, new_id
from schemaless.cleaner import Cleaner

from .countbench import _drop
from .env import Servers, start_cluster
from .measure import run_interleaved

__all__ = ["main"]

SIDES = {"path": "author.id", "top": "author_id"}


def _index(prop: str) -> Index:
    return Index("by_author", {prop: "uuid", "published": "int"})


def _doc(side: str, author: bytes, published: int) -> dict[str, Any]:
    base = {"published": published, "title": "x" * 40, "author": {"name": "ada"}}
    if side == "path":
        return {**base, "author": {"id": author, "name": "ada"}}
    return {**base, "author_id": author}


def _open(servers: Servers, indexes: list[Index]) -> DataStore:
    prefix = "pb_" + uuid.uuid4().hex[:10]
    return DataStore(
        list(servers.addresses), indexes, prefix=prefix, option_file=servers.option_file
    )


def _calls(ds: DataStore, side: str, authors: list[bytes]) -> dict[str, Callable[[Any], object]]:
    """put and query of one side, loaded with ``per-author`` documents each."""
    clock = itertools.count(1)
    where = SIDES[side]

    def put(_: object) -> None:
        ds.put(_doc(side, random.choice(authors), next(clock)))

    def query(_: object) -> None:
        page = ds.query("by_author", where={where: random.choice(authors)}, order="desc")
        assert len(page) == 20

    return {f"put {side}": put, f"query {side}": query}


def _backfills(servers: Servers, n: int, rounds: int) -> dict[str, list[float]]:
    """Seconds of each side's backfill of ``n`` stored documents, alternated."""
    out: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(rounds):
        for side in list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]:
            ds = _open(servers, [])
            try:
                authors = [new_id() for _ in range(max(1, n // 50))]
                for start in range(0, n, 1000):
                    ds.put_many(
                        _doc(side, random.choice(authors), i)
                        for i in range(start, min(n, start + 1000))
                    )
                ds.declare_index(_index(SIDES[side]), force=True)
                started = time.perf_counter()
                assert Cleaner(ds).backfill("by_author") == "ready"
                out[side].append(time.perf_counter() - started)
            finally:
                _drop(servers, ds)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pathbench")
    parser.add_argument("--dir", default=".bench-cluster", help="the local cluster's directory")
    parser.add_argument("--authors", type=int, default=200)
    parser.add_argument("--per-author", type=int, default=50)
    parser.add_argument("--backfill", type=int, default=20_000, help="documents backfilled")
    parser.add_argument("--seconds", type=float, default=4.0, help="per measured call")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    servers = start_cluster(args.dir)
    stores = {side: _open(servers, [_index(prop)]) for side, prop in SIDES.items()}
    try:
        calls: dict[str, tuple[Callable[[Any], object], Iterator[Any]]] = {}
        for side, ds in stores.items():
            authors = [new_id() for _ in range(args.authors)]
            docs = (_doc(side, a, i) for a in authors for i in range(args.per_author))
            ds.put_many(docs)
            for name, fn in _calls(ds, side, authors).items():
                calls[name] = (fn, itertools.repeat(None))
        ops = {
            k: v.summary() for k, v in run_interleaved(calls, 1, args.seconds, args.rounds).items()
        }
    finally:
        for ds in stores.values():
            _drop(servers, ds)
    backfill = _backfills(servers, args.backfill, args.rounds)
    median = {side: statistics.median(times) for side, times in backfill.items()}
    print(
        json.dumps(
            {
                "put path / top (p50)": round(
                    ops["put path"]["p50_ms"] / ops["put top"]["p50_ms"], 3
                ),
                "query path / top (p50)": round(
                    ops["query path"]["p50_ms"] / ops["query top"]["p50_ms"], 3
                ),
                "backfill path / top (median s)": round(median["path"] / median["top"], 3),
                "ops": ops,
                "backfill_seconds": backfill,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
