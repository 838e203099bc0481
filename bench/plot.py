"""``python -m bench.plot``: PNG charts from benchmark results (docs/img/ by default).

Examples::

    python -m bench.plot bench/results/20261121T190000Z.json
    python -m bench.plot small.json medium.json large.json --timeline timeline.json

With one operation-benchmark file: ``ratios.png`` (schemaless time / raw time per
operation, one bar per thread count, the targets as lines) and ``latency.png`` (p50 at
one thread).  With several files at different ``--entities``: also ``scale.png`` (time
per operation against data size).  ``--timeline``: ``timeline.png``.  Needs matplotlib
(in the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "plot_ratios", "plot_scale", "plot_timeline", "plot_writer"]

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "img"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ops(results: dict[str, Any]) -> list[str]:
    seen: dict[str, str] = {}
    for row in results["ops"]:
        seen.setdefault(row["op"], row["title"])
    return list(seen)


def _subtitle(results: dict[str, Any]) -> str:
    m = results["meta"]["machine"]
    cfg = results["meta"]["config"]
    return (
        f"{cfg['entities']:,} entities, {cfg['shards']} logical shards on {m['servers']} "
        f"MariaDB {m['mariadb'].split('-')[0]} servers, "
        f"{'durable' if m['durable'] else 'not durable'}, {m['nproc']} cores"
    )


def plot_ratios(results: dict[str, Any], out: Path) -> list[Path]:
    """Bars of ratios per operation and thread count; p50 latencies at one thread."""
    plt = _plt()
    ops = _ops(results)
    threads = sorted({row["threads"] for row in results["ops"]})
    by = {(row["op"], row["threads"]): row for row in results["ops"]}
    width = 0.8 / max(1, len(threads))
    fig, ax = plt.subplots(figsize=(11, 4.8))
    for k, t in enumerate(threads):
        xs = [i + (k - (len(threads) - 1) / 2) * width for i in range(len(ops))]
        ys = [by[(op, t)]["ratio"] if (op, t) in by else 0 for op in ops]
        ax.bar(xs, ys, width, label=f"{t} thread{'s' if t > 1 else ''}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.25, color="tab:red", linestyle="--", linewidth=1, label="target 1.25")
    ax.axhline(1.5, color="tab:purple", linestyle=":", linewidth=1, label="target 1.5 (scatter)")
    ax.set_xticks(range(len(ops)), ops, rotation=20, ha="right")
    ax.set_ylabel("schemaless time / raw time")
    ax.set_title("Overhead against raw mysqlclient (lower is better)\n" + _subtitle(results))
    ax.legend(fontsize=8, ncols=2)
    fig.tight_layout()
    paths = [out / "ratios.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    t1 = threads[0]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    xs = list(range(len(ops)))
    sl = [by[(op, t1)]["schemaless"]["p50_ms"] if (op, t1) in by else 0 for op in ops]
    raw = [by[(op, t1)]["raw"]["p50_ms"] if (op, t1) in by else 0 for op in ops]
    ax.bar([x - 0.2 for x in xs], sl, 0.4, label="schemaless")
    ax.bar([x + 0.2 for x in xs], raw, 0.4, label="raw mysqlclient")
    ax.set_xticks(xs, ops, rotation=20, ha="right")
    ax.set_ylabel(f"p50 latency, ms ({t1} thread)")
    ax.set_title("Median latency per operation\n" + _subtitle(results))
    ax.legend()
    fig.tight_layout()
    paths.append(out / "latency.png")
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def plot_scale(runs: list[dict[str, Any]], out: Path) -> Path:
    """Median time per operation (1 thread) against the number of entities loaded;
    writes and reads in two panels."""
    plt = _plt()
    runs = sorted(runs, key=lambda r: r["meta"]["config"]["entities"])
    sizes = [r["meta"]["config"]["entities"] for r in runs]
    ops = [op for op in _ops(runs[-1]) if all(op in _ops(r) for r in runs)]
    writes = [op for op in ops if op.startswith(("put", "update", "delete"))]
    reads = [op for op in ops if op not in writes]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, group, what in ((axes[0], writes, "writes"), (axes[1], reads, "reads")):
        for n, op in enumerate(group):
            color = colors[n % len(colors)]
            for side, style in (("schemaless", "-"), ("raw", "--")):
                ys = []
                for r in runs:
                    rows = [x for x in r["ops"] if x["op"] == op]
                    row = min(rows, key=lambda x: x["threads"])
                    ys.append(row[side]["p50_ms"])
                ax.plot(sizes, ys, style, marker="o", color=color,
                        label=op if side == "schemaless" else None)  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("entities loaded")
        ax.set_ylabel("p50 latency, ms (1 thread)")
        ax.set_title(f"{what} (solid: schemaless, dashed: raw)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle("Cost against data size")
    fig.tight_layout()
    path = out / "scale.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(model: str) -> str:
    return model.replace(", ", ",\n")


def plot_timeline(results: dict[str, Any], out: Path) -> Path:
    """Timelines per second (first and older page) and submissions per second."""
    plt = _plt()
    models = list(results["models"])
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), width_ratios=[3, 2])
    xs = list(range(len(models)))
    first = [results["models"][m]["timelines_first"]["per_s"] for m in models]
    older = [results["models"][m]["timelines_older"]["per_s"] for m in models]
    axes[0].bar([x - 0.2 for x in xs], first, 0.4, label="first page")
    axes[0].bar([x + 0.2 for x in xs], older, 0.4, label="older page")
    axes[0].set_ylabel("timelines / s")
    axes[0].set_xticks(xs, [_label(m) for m in models], rotation=30, ha="right", fontsize=9)
    axes[0].legend()
    writers = [m for m in models if "submissions" in results["models"][m]]
    subs = [results["models"][m]["submissions"]["per_s"] for m in writers]
    axes[1].bar(range(len(writers)), subs, 0.5, color="tab:green")
    axes[1].set_ylabel("submissions / s")
    axes[1].set_xticks(
        range(len(writers)), [_label(m) for m in writers], rotation=30, ha="right", fontsize=9
    )
    m = results["meta"]
    fig.suptitle(
        f"Timeline (Oku 2008): {m['users']:,} users, {m['messages']:,} messages, "
        f"{m['followers_mean']} followers per user"
    )
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_writer(results: dict[str, Any], out: Path) -> Path:
    """The backfill's writer: its p99 per half second before and during each Cleaner
    run (0 = the Cleaner starts; the run ends at the dotted line)."""
    plt = _plt()
    bf = results["backfill"]
    runs = {
        "cleaner_throttled": "default throttle",
        "cleaner": f"--no-throttle --jobs {results['meta']['config']['cleaner_jobs']}",
        "cleaner_jobs1": "--no-throttle --jobs 1",
    }
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for (key, label), color in zip(
        runs.items(), ("tab:green", "tab:red", "tab:orange"), strict=True
    ):
        series = bf.get(key, {}).get("writer_series")
        if not series:
            continue
        ax.plot([t for t, _, _ in series], [p99 for _, _, p99 in series], color=color,
                label=f"{label} ({bf[key]['seconds']:.1f} s)")  # fmt: skip
        ax.axvline(bf[key]["process_seconds"], color=color, linestyle=":", linewidth=1)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("seconds after the Cleaner starts (before 0: idle, the grace period)")
    ax.set_ylabel("writer's p99 per 0.5 s, ms")
    ax.set_ylim(bottom=0)
    ax.set_title(
        "A writer's put latency while the Cleaner backfills an index\n" + _subtitle(results)
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "backfill-writer.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="*", help="operation-benchmark JSON files")
    p.add_argument("--timeline", default=None, help="a timeline JSON file")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="directory (default docs/img)")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [json.loads(Path(f).read_text()) for f in a.results]
    written: list[Path] = []
    if runs:
        main_run = max(runs, key=lambda r: r["meta"]["config"]["entities"])
        written += plot_ratios(main_run, out)
        if len({r["meta"]["config"]["entities"] for r in runs}) > 1:
            written.append(plot_scale(runs, out))
    if a.timeline:
        written.append(plot_timeline(json.loads(Path(a.timeline).read_text()), out))
    if not written:
        p.error("give at least one results file or --timeline")
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
