"""``python -m bench.page [FILE.json ...]``: docs/benchmarks.md's tables and plots.

Each area a results file holds (core operations, queries, change feed, unique, codec,
backfill, dump, timeline, layout; ``headline``, in README.md) is rendered as Markdown,
stamped with the file's date, commit and command, and written in place between
``<!-- generated: AREA -->`` and ``<!-- end generated: AREA -->`` in the pages; the
plots go to docs/results/.  A block whose area no file holds keeps what it has (its own,
older, stamp).  Without files: the newest of each bench in bench/results/ (what
``make bench`` just wrote).  A results file without its provenance (date, commit,
command: recorded since the harness's ``write_results`` has it) is refused.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import markdown as md
from .provenance import ROOT

__all__ = ["ResultsError", "load", "main", "render", "rewrite", "update"]

PAGES = (ROOT / "docs" / "benchmarks.md", ROOT / "README.md")
OUT = ROOT / "docs" / "results"
RESULTS = ROOT / "bench" / "results"
#: the files of each bench in bench/results/ (``write_results``'s names)
KINDS = {"ops": re.compile(r"\d{8}T\d{6}Z\.json"), "timeline": re.compile(r"timeline-.*\.json"),
         "layout": re.compile(r"layout-.*\.json")}  # fmt: skip
CORE = ("put_0idx", "put_0idx_own_id", "put_1idx", "put_3idx", "put_1idx_ordered",
        "put_3idx_ordered", "update", "get", "get_many", "delete")  # fmt: skip
QUERIES = ("query_eq", "scatter_p1", "scatter_p10")
FEED_UNIQUE = (
    ("feed", "put_changes", "What the change feed adds to a put"),
    ("unique", "put_unique_idx", "What the unique claim adds to a put"),
)
BLOCK = re.compile(r"(<!-- generated: (\w+)[^>]*-->\n).*?(<!-- end generated: \2 -->)", re.S)


class ResultsError(ValueError):
    """A results file the page cannot use, or a page without a block for an area."""


def load(path: Path) -> dict[str, Any]:
    """The results in ``path``; refused without a date, commit and command."""
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path}: cannot read results: {exc}") from exc
    prov = results.get("meta", {}).get("provenance") or {}
    missing = [k for k in ("date", "commit", "command") if not prov.get(k)]
    if missing:
        raise ResultsError(
            f"{path}: no {', '.join(missing)} recorded (meta.provenance): the page shows"
            " only figures it can date; rerun the bench to get a file that has them"
        )
    return dict(results)


def stamp(r: dict[str, Any]) -> str:
    """The line under every block: when, at which commit, by which command, on what."""
    p, m = r["meta"]["provenance"], r["meta"]["machine"]
    load = " / ".join(f"{x:g}" for x in p.get("load_average", []))
    return (
        f"<sub>{p['date'].replace('T', ' ').replace('+00:00', ' UTC')} · commit"
        f" `{p['commit']}` · `{p['command']}` · {m['servers']} MariaDB"
        f" {m['mariadb'].split('-')[0]} servers, {'durable' if m['durable'] else 'not durable'},"
        f" {m['nproc']} cores shared with other work (load average {load})</sub>"
    )


def _ops_areas(r: dict[str, Any], out: Path) -> dict[str, str]:
    from .plot import plot_ratios, plot_writer

    names = {row["op"] for row in r.get("ops", [])}
    areas: dict[str, str] = {}
    if names:
        areas["targets"] = md.targets_table(r)
        areas["headline"] = _headline(r)
    if names & set(CORE):
        plots = "\n\n".join(f"![{p.stem}](results/{p.name})" for p in plot_ratios(r, out))
        areas["core"] = md.ops_table(r, CORE) + "\n\n" + plots
    if names & set(QUERIES):
        areas["queries"] = md.ops_table(r, QUERIES)
    for area, op, what in FEED_UNIQUE:
        if op in names:
            table = md.ops_table(r, ("put_int_idx", op))
            areas[area] = table + "\n\n" + md.relative_line(r, op, "put_int_idx", what)
    if "codec" in r:
        areas["codec"] = md.codec_table(r)
    if "backfill" in r:
        plot = plot_writer(r, out)
        areas["backfill"] = md.backfill_table(r) + f"\n\n![{plot.stem}](results/{plot.name})"
    if "dump" in r:
        areas["dump"] = md.dump_table(r["dump"])
    return areas


def _headline(r: dict[str, Any]) -> str:
    """README's few lines: put, get and queries against raw, the backfill against ALTER."""
    ratio = {(row["op"], row["threads"]): row["ratio"] for row in r["ops"]}
    threads = sorted({t for _, t in ratio})
    lines = [f"| schemaless time / raw mysqlclient time, {' / '.join(map(str, threads))}"
             " client threads | |", "|---|---|"]  # fmt: skip
    for op, title in (("put_1idx", "put, 1 index"), ("put_3idx", "put, 3 indexes"),
                      ("get", "get"), ("query_eq", "equality query, page of 20"),
                      ("scatter_p1", "query over every shard, page of 20")):  # fmt: skip
        if (op, threads[0]) in ratio:
            lines.append(f"| {title} | {' / '.join(f'{ratio[(op, t)]:.2f}' for t in threads)} |")
    bf = r.get("backfill", {})
    if "cleaner" in bf:
        lines.append(
            f"| an index backfilled on {bf['entities']:,} entities by the Cleaner, against"
            f" MariaDB's `ALTER TABLE ... ADD INDEX` | {bf['cleaner']['seconds']:.1f} s against"
            f" {bf['alter']['seconds']:.1f} s ({bf['cleaner']['vs_alter']}x) |"
        )
    return "\n".join(lines)


def _timeline_areas(r: dict[str, Any], out: Path) -> dict[str, str]:
    from .plot import plot_timeline

    plot = plot_timeline(r, out)
    return {"timeline": md.timeline_table(r) + f"\n\n![{plot.stem}](results/{plot.name})"}


def _layout_areas(r: dict[str, Any], out: Path) -> dict[str, str]:
    return {"layout": md.layout_table(r)}


def render(r: dict[str, Any], out: Path = OUT) -> dict[str, str]:
    """Every area ``r`` holds: its block's text, stamped; its plots written to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    which: Callable[[dict[str, Any], Path], dict[str, str]]
    if "models" in r:
        which = _timeline_areas
    elif "sizes" in r:
        which = _layout_areas
    else:
        which = _ops_areas
    return {area: f"{text}\n\n{stamp(r)}\n" for area, text in which(r, out).items()}


def rewrite(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each generated block of an area in ``blocks`` replaced; the rest,
    and blocks of other areas, as they were."""

    def sub(m: re.Match[str]) -> str:
        body = blocks.get(m.group(2))
        return m.group(0) if body is None else m.group(1) + body + m.group(3)

    return BLOCK.sub(sub, text)


def update(
    files: Sequence[Path], pages: Sequence[Path] = PAGES, out: Path = OUT
) -> dict[str, Path]:
    """Render ``files`` (later files win an area) into ``pages``; each area -> its page.
    Every area rendered must have a block in some page, or no page is rewritten."""
    results = [load(f) for f in files]  # all checked before anything is written
    blocks: dict[str, str] = {}
    for r in results:
        blocks.update(render(r, out))
    texts = {page: page.read_text() for page in pages}
    where = {m.group(2): page for page, t in texts.items() for m in BLOCK.finditer(t)}
    if missing := sorted(set(blocks) - set(where)):
        raise ResultsError(f"no generated block for {', '.join(missing)} in any of the pages")
    for page, text in texts.items():
        new = rewrite(text, blocks)
        if new != text:
            page.write_text(new)
    return {area: where[area] for area in blocks}


def newest(results_dir: Path = RESULTS) -> list[Path]:
    """The newest results file of each bench in ``results_dir``."""
    found = []
    for pattern in KINDS.values():
        names = sorted(p for p in results_dir.glob("*.json") if pattern.fullmatch(p.name))
        found += names[-1:]
    return found


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.page", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", type=Path, help="results (default: the newest of each)")
    a = p.parse_args(argv)
    files = a.files or newest()
    if not files:
        p.error(f"no results files in {RESULTS}: run a bench first (make bench)")
    try:
        for area, page in update(files).items():
            print(f"{page.relative_to(ROOT)}: {area}")
    except ResultsError as exc:
        p.exit(1, f"python -m bench.page: error: {exc}\n")


if __name__ == "__main__":
    main()
