"""Results as Markdown tables: what ``python -m bench.page`` puts in docs/benchmarks.md."""

from __future__ import annotations

import statistics
from collections.abc import Collection
from typing import Any

from .harness import TARGETS

__all__ = [
    "backfill_table",
    "codec_table",
    "dump_table",
    "layout_table",
    "ops_table",
    "relative_line",
    "targets_line",
    "timeline_table",
]


def ops_table(r: dict[str, Any], ops: Collection[str] | None = None) -> str:
    """Ratios at every thread count, ops/s and latencies at one, round trips; the
    operations ``ops`` (all by default), in the order they ran."""
    rows = [row for row in r["ops"] if ops is None or row["op"] in ops]
    threads = sorted({row["threads"] for row in rows})
    by = {(row["op"], row["threads"]): row for row in rows}
    titles: dict[str, str] = {}
    for row in rows:
        titles.setdefault(row["op"], row["title"])
    rts = r.get("round_trips", {})
    head = (
        "| operation | target | "
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

        target = f"≤ {TARGETS[op]}" if op in TARGETS else ""
        lines.append(
            f"| {title} | {target} | "
            + " | ".join(ratios)
            + f" | {sl} | {raw} | {fmt('schemaless')} |"
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
    g = r["goals"]
    lines += [
        "",
        f"Schemaless pull against raw pull: {g['pull_retrieval_vs_raw']}x the timelines per"
        f" second (first page), {g['pull_older_vs_raw']}x (older page); goal ≥ 3x. Schemaless"
        f" push against raw push: {g['push_retrieval_vs_raw']}x and {g['push_older_vs_raw']}x"
        f" (goal ≥ 0.5x), where the layout's own floor reaches"
        f" {g['push_floor_retrieval_vs_raw']}x and {g['push_floor_older_vs_raw']}x.",
    ]
    return "\n".join(lines)


def relative_line(r: dict[str, Any], op: str, base: str, what: str) -> str:
    """One sentence: ``op``'s schemaless time per operation against ``base``'s, at each
    thread count (what the feed or a unique index adds to a put)."""
    rate = {(row["op"], row["threads"]): row["schemaless"]["throughput"] for row in r["ops"]}
    threads = sorted(t for o, t in rate if o == op and (base, t) in rate)
    if not threads:
        return ""
    ratios = " / ".join(f"{rate[(base, t)] / rate[(op, t)]:.2f}" for t in threads)
    counts = " / ".join(map(str, threads))
    return f"{what}: `{op}` takes {ratios}x the time of `{base}` at {counts} threads."


def targets_line(r: dict[str, Any], keys: Collection[str]) -> str:
    """The targets ``bench.harness.evaluate`` judged whose first word is in ``keys``:
    how many were met, and those missed by name."""
    mine = [t for t in r.get("targets", []) if t["target"].split()[0].rstrip(":") in keys]
    if not mine:
        return ""
    missed = [f"{t['target']} ({t['measured']})" for t in mine if not t["met"]]
    tail = "; missed: " + "; ".join(missed) + "." if missed else "."
    return f"Targets: {len(mine) - len(missed)} of {len(mine)} met{tail}"


def backfill_table(r: dict[str, Any]) -> str:
    """The backfill of one index: MariaDB's ALTER, the floor, the Cleaner's runs, and
    the writer's p99 during each run against its idle p99."""
    bf, cfg = r["backfill"], r["meta"]["config"]
    names = {
        "alter": "MariaDB `ALTER TABLE ... ADD INDEX`, one table",
        "alter_sharded": "the same, one table per server, in parallel",
        "insert_floor": "insert floor (the inserts alone)",
        "naive": "naive loop (one thread)",
        "cleaner_throttled": f"the Cleaner, default throttle, --jobs {cfg['throttled_jobs']}",
        "cleaner": f"the Cleaner, --no-throttle --jobs {cfg['cleaner_jobs']}",
        "cleaner_jobs1": "the Cleaner, --no-throttle --jobs 1",
        "cleaner_python": "the Cleaner, --no-throttle --jobs 1, Python path only",
    }
    alter = bf["alter"]["seconds"]
    lines = [
        "| backfill | seconds | vs ALTER | servers' CPU s | Cleaner CPU µs/entity"
        " | writer p99 idle → during, ms |",
        "|---|---|---|---|---|---|",
    ]
    for key, name in names.items():
        x = bf.get(key)
        if not x:
            continue
        cpu = x.get("servers_backfill_cpu_s", x.get("servers_cpu_s", ""))
        w = x.get("writer")
        writer = (
            f"{w['idle_p99_ms']:.1f} → {w['during_p99_ms']:.1f} ({w['p99_ratio']}x)" if w else ""
        )
        lines.append(
            f"| {name} | {x['seconds']:.2f} | {x['seconds'] / alter:.2f}x | {cpu} |"
            f" {x.get('cpu_us_per_entity', '')} | {writer} |"
        )
    pairs = [p for p in bf.get("throttle_pairs", []) if p["p99_ratio"] is not None]
    if pairs:
        p99 = statistics.median(p["p99_ratio"] for p in pairs)
        speed = statistics.median(p["speed"] for p in pairs)
        lines += [
            "",
            f"The default throttle over {len(pairs)} throttled/unthrottled pair(s), medians:"
            f" the writer's p99 {p99}x idle at {speed}x the unthrottled speed.",
        ]
    return "\n".join(lines)


def dump_table(d: dict[str, Any]) -> str:
    """``schemaless dump``/``restore`` in both encodings against mysqldump."""
    lines = [
        "| tool | dump entities/s | restore entities/s | size MB | vs mysqldump (dump / restore)"
        " | index backfill after restore, s |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("jsonl", "native", "mysqldump"):
        x = d[name]
        tool = "mysqldump / mariadb" if name == "mysqldump" else f"schemaless, {name}"
        vs = bf = ""
        if name != "mysqldump":
            vs = f"{x['dump']['vs_mysqldump']:.2f}x / {x['restore']['vs_mysqldump']:.2f}x"
            bf = f"{x['backfill']['seconds']:.2f}"
        lines.append(
            f"| {tool} | {x['dump']['per_s']:.0f} | {x['restore']['per_s']:.0f} |"
            f" {x['bytes'] / 1e6:.2f} | {vs} | {bf} |"
        )
    return "\n".join(lines)


def layout_table(r: dict[str, Any]) -> str:
    """Per operation: the base layout's p50 and each layout's as a multiple of it (reads
    against ``a_union``, writes against ``today``), at each count of shards per server."""
    lines: list[str] = []
    for part, base in (("ops", "a_union"), ("writes", "today")):
        sizes = [s for s in r["sizes"] if s.get(part)]
        if not sizes:
            continue
        counts = " / ".join(str(s["per_server"]) for s in sizes)
        layouts = [n for n in next(iter(sizes[0][part].values())) if n != base]
        what = "read" if part == "ops" else "write"
        lines += [
            "",
            f"| {what}, at {counts} shards per server | {base} p50 ms | "
            + " | ".join(layouts)
            + " |",
            "|---|---|" + "---|" * len(layouts),
        ]
        for op in sizes[0][part]:
            by = [s[part][op] for s in sizes if op in s[part]]
            cells = [" / ".join(f"{b[n]['p50_ms'] / b[base]['p50_ms']:.2f}" for b in by)
                     for n in layouts]  # fmt: skip
            p50 = " / ".join(f"{b[base]['p50_ms']:.2f}" for b in by)
            lines.append(f"| {op} | {p50} | " + " | ".join(cells) + " |")
    return "\n".join(lines).strip("\n")
