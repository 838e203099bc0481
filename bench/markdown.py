"""``python -m bench.markdown FILE.json``: results as Markdown tables (for docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["ops_table", "timeline_table"]


def ops_table(r: dict[str, Any]) -> str:
    threads = sorted({row["threads"] for row in r["ops"]})
    by = {(row["op"], row["threads"]): row for row in r["ops"]}
    titles: dict[str, str] = {}
    for row in r["ops"]:
        titles.setdefault(row["op"], row["title"])
    rts = r.get("round_trips", {})
    head = (
        "| operation | "
        + " | ".join(f"ratio {t} thr" for t in threads)
        + " | schemaless ops/s (p50 / p99 ms), 1 thr | raw ops/s (p50 / p99 ms), 1 thr"
        + " | round trips / steps, schemaless | raw |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for op, title in titles.items():
        ratios = [f"{by[(op, t)]['ratio']:.2f}" if (op, t) in by else "" for t in threads]
        one = by.get((op, threads[0]))
        sl = raw = ""
        if one:
            s, w = one["schemaless"], one["raw"]
            sl = f"{s['throughput']:.0f} ({s['p50_ms']:.2f} / {s['p99_ms']:.2f})"
            raw = f"{w['throughput']:.0f} ({w['p50_ms']:.2f} / {w['p99_ms']:.2f})"
        rt = rts.get(op, {})

        def fmt(side: str, rt: dict[str, Any] = rt) -> str:
            x = rt.get(side)
            return f"{x['round_trips']:g} / {x['sequential']:g}" if x else ""

        lines.append(
            f"| {title} | " + " | ".join(ratios) + f" | {sl} | {raw} | {fmt('schemaless')} |"
            f" {fmt('raw')} |"
        )
    return "\n".join(lines)


def codec_table(r: dict[str, Any]) -> str:
    c = r["codec"]
    lines = [
        "| format | bytes (mean) | encode µs | decode µs | round trip µs | size vs pickle2+zlib"
        " | speed vs pickle2+zlib |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in c["formats"]:
        lines.append(
            f"| {f['format']} | {f['bytes_mean']:.0f} | {f['encode_us']:.1f} | "
            f"{f['decode_us']:.1f} | {f['round_trip_us']:.1f} | {f['size_vs_pickle2']:.2f} | "
            f"{f['speedup_vs_pickle2']:.2f}x |"
        )
    return "\n".join(lines)


def timeline_table(r: dict[str, Any]) -> str:
    lines = [
        "| model | data size (MB) | submissions/s | timelines/s (first page) |"
        " timelines/s (older page) | p50 ms (first page) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in r["models"].items():
        size = r["size_mb"].get(name, "")
        sub = row.get("submissions", {}).get("per_s")
        lines.append(
            f"| {name} | {size} | {f'{sub:.0f}' if sub else ''} | "
            f"{row['timelines_first']['per_s']:.0f} | {row['timelines_older']['per_s']:.0f} | "
            f"{row['timelines_first']['p50_ms']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.markdown", description="Benchmark results as Markdown tables"
    )
    parser.add_argument("files", nargs="+", metavar="FILE.json", help="from bench/results")
    for name in parser.parse_args().files:
        r = json.loads(Path(name).read_text())
        if "models" in r:
            print(timeline_table(r))
        else:
            print(ops_table(r))
            if "codec" in r:
                print()
                print(codec_table(r))
        print()


if __name__ == "__main__":
    main()
