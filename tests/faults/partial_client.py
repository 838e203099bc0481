"""A fresh client process for the partial-cluster tests: opens a datastore and runs a
plan of operations, one JSON line of outcome each.

    python tests/faults/partial_client.py --prefix P --option-file F --timeout T \\
        [--index NAME:PROP] HOST:PORT... < plan.json

The plan is a JSON list of ``[op, argument]``: ``["get", id]``, ``["get_many", [id,
...]]``, ``["put", entity]``, ``["delete", id]``, ``["query", {"n": value}]`` (on the
index ``by_n``; ``"partial": true`` in the conditions asks for a partial page); ids
in hex.  The first line printed is ``{"opened": seconds}`` or the error that opening
raised; then ``{"ok": result}`` or ``{"error": type, "message": text, "seconds": s}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from schemaless import DataStore, Index


def _run(ds: DataStore, op: str, arg: Any) -> Any:
    if op == "get":
        found = ds.get(bytes.fromhex(arg))
        return None if found is None else found["n"]
    if op == "get_many":
        return [None if e is None else e["n"] for e in ds.get_many(bytes.fromhex(a) for a in arg)]
    if op == "put":
        return ds.put({**arg, "id": bytes.fromhex(arg["id"])})
    if op == "delete":
        return ds.delete(bytes.fromhex(arg))
    if op == "query":
        page = ds.query("by_n", **arg)
        return {"ids": [e["id"].hex() for e in page], "missing": list(page.missing_shards)}
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("servers", nargs="+")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--option-file", required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--index", action="append", default=[])
    args = parser.parse_args()
    plan = json.load(sys.stdin)
    indexes = [Index(name, {prop: "int"}) for name, prop in (i.split(":") for i in args.index)]
    started = time.monotonic()
    try:
        ds = DataStore(
            args.servers,
            indexes,
            prefix=args.prefix,
            option_file=args.option_file,
            create=False,
            connect_timeout=args.timeout,
            read_timeout=args.timeout,
            write_timeout=args.timeout,
        )
    except Exception as exc:
        seconds = time.monotonic() - started
        print(json.dumps({"error": type(exc).__name__, "message": str(exc), "seconds": seconds}))
        return
    print(json.dumps({"opened": time.monotonic() - started}), flush=True)
    for op, arg in plan:
        started = time.monotonic()
        try:
            out: dict[str, Any] = {"ok": _run(ds, op, arg)}
        except Exception as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
        out["seconds"] = time.monotonic() - started
        print(json.dumps(out), flush=True)
    ds.close()


if __name__ == "__main__":
    main()
