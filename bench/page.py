"""``python -m bench.page [FILE.json ...]``: docs/benchmarks.md's tables and plots.

Each area (``AREAS``: core operations, queries, change feed, unique, codec, backfill,
dump, timeline, layout; the headline in README.md) is rendered from the latest run that
has it, stamped with that run's date, commit and command, and written in place between
``<!-- generated: AREA -->`` and ``<!-- end generated: AREA -->``; the plots go to
docs/results/.  A run claims an operations table only if it measured all of its rows
(``--ops get`` rewrites none).  A block no run has keeps what it holds, with its own
older stamp.  Without files: every run saved in bench/results/ (``make bench`` has just
added its own).  A results file without its date, commit and command is refused.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from . import markdown as md
from .provenance import ROOT

__all__ = ["AREAS", "ResultsError", "load", "main", "render", "rewrite", "saved_runs", "update"]

PAGES = (ROOT / "docs" / "benchmarks.md", ROOT / "README.md")
OUT = ROOT / "docs" / "results"
RESULTS = ROOT / "bench" / "results"
CORE = ("put_0idx", "put_0idx_own_id", "put_1idx", "put_3idx", "put_1idx_ordered",
        "put_3idx_ordered", "update", "get", "get_many", "delete")  # fmt: skip
QUERIES = ("query_eq", "scatter_p1", "scatter_p10")
FEED = ("put_int_idx", "put_changes")
UNIQUE = ("put_int_idx", "put_unique_idx")
#: the first words of the backfill's targets (``bench.harness._backfill_targets``)
BACKFILL_TARGETS = ("Cleaner", "servers'", "writer", "throttled")
BLOCK = re.compile(r"(<!-- generated: (\w+)[^>]*-->\n).*?(<!-- end generated: \2 -->)", re.S)

Results = dict[str, Any]


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
        f" {m['nproc']} cores, load average {load}</sub>"
    )


def _measured(*ops: str) -> Callable[[Results], bool]:
    """Whether a run measured every one of ``ops`` (a partial run claims no table)."""
    return lambda r: set(ops) <= {row["op"] for row in r.get("ops", [])}


def _image(path: Path) -> str:
    return f"![{path.stem}](results/{path.name})"


def _core(r: Results, out: Path) -> str:
    from .plot import plot_ratios

    plots = "\n\n".join(_image(p) for p in plot_ratios(r, out))
    return f"{md.ops_table(r, CORE)}\n\n{md.targets_line(r, CORE)}\n\n{plots}"


def _versus(ops: tuple[str, str], what: str) -> Callable[[Results, Path], str]:
    """A put against the same put on a plain int index (the feed, a unique index)."""

    def text(r: Results, out: Path) -> str:
        line = md.relative_line(r, ops[1], ops[0], what)
        return f"{md.ops_table(r, ops)}\n\n{line} {md.targets_line(r, ops[1:])}"

    return text


def _backfill(r: Results, out: Path) -> str:
    from .plot import plot_writer

    plot = _image(plot_writer(r, out))
    return f"{md.backfill_table(r)} {md.targets_line(r, BACKFILL_TARGETS)}\n\n{plot}"


def _timeline(r: Results, out: Path) -> str:
    from .plot import plot_timeline

    return f"{md.timeline_table(r)}\n\n{_image(plot_timeline(r, out))}"


def _headline(r: Results, out: Path) -> str:
    """README's lines: put, get and queries against raw at each thread count."""
    ratio = {(row["op"], row["threads"]): row["ratio"] for row in r["ops"]}
    threads = sorted({t for _, t in ratio})
    lines = [f"| schemaless time / raw mysqlclient time | {' / '.join(map(str, threads))}"
             " client threads |", "|---|---|"]  # fmt: skip
    for op, title in (("put_1idx", "put, 1 index"), ("put_3idx", "put, 3 indexes"),
                      ("get", "get"), ("query_eq", "equality query, page of 20"),
                      ("scatter_p1", "query over every shard, page of 20")):  # fmt: skip
        lines.append(f"| {title} | {' / '.join(f'{ratio[(op, t)]:.2f}' for t in threads)} |")
    return "\n".join(lines)


def _headline_backfill(r: Results, out: Path) -> str:
    """README's line on the backfill: the Cleaner against MariaDB's ALTER."""
    bf = r["backfill"]
    return (
        f"An index backfilled on {bf['entities']:,} entities by the Cleaner"
        f" (`--no-throttle --jobs {r['meta']['config']['cleaner_jobs']}`):"
        f" {bf['cleaner']['seconds']:.1f} s, {bf['cleaner']['vs_alter']}x"
        f" MariaDB's `ALTER TABLE ... ADD INDEX` on the same documents"
        f" ({bf['alter']['seconds']:.2f} s)."
    )


#: area -> (whether a run has it, its block's text, plots written to ``out``)
AREAS: dict[str, tuple[Callable[[Results], bool], Callable[[Results, Path], str]]] = {
    "headline": (_measured(*CORE, *QUERIES), _headline),
    "headline_backfill": (lambda r: "cleaner" in r.get("backfill", {}), _headline_backfill),
    "core": (_measured(*CORE), _core),
    "queries": (
        _measured(*QUERIES),
        lambda r, out: f"{md.ops_table(r, QUERIES)}\n\n{md.targets_line(r, QUERIES)}",
    ),
    "feed": (_measured(*FEED), _versus(FEED, "What the change feed adds to a put")),
    "unique": (_measured(*UNIQUE), _versus(UNIQUE, "What the unique claim adds to a put")),
    "codec": (
        lambda r: "codec" in r,
        lambda r, out: f"{md.codec_table(r)}\n\n{md.targets_line(r, ('codec',))}",
    ),
    "backfill": (lambda r: "cleaner" in r.get("backfill", {}), _backfill),
    "dump": (lambda r: "dump" in r, lambda r, out: md.dump_table(r["dump"])),
    "timeline": (lambda r: "models" in r, _timeline),
    "layout": (lambda r: "sizes" in r, lambda r, out: md.layout_table(r)),
}


def render(r: Results, out: Path = OUT, areas: Collection[str] | None = None) -> dict[str, str]:
    """Every area ``r`` has (of ``areas``): its block's text, stamped; plots to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    return {
        area: f"{text(r, out)}\n\n{stamp(r)}\n"
        for area, (has, text) in AREAS.items()
        if (areas is None or area in areas) and has(r)
    }


def rewrite(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each generated block of an area in ``blocks`` replaced; the rest,
    and blocks of other areas, as they were."""

    def sub(m: re.Match[str]) -> str:
        body = blocks.get(m.group(2))
        return m.group(0) if body is None else m.group(1) + body + m.group(3)

    return BLOCK.sub(sub, text)


def update(
    runs: Sequence[Results], pages: Sequence[Path] = PAGES, out: Path = OUT
) -> dict[str, Path]:
    """Rewrite the blocks of ``pages`` from ``runs``, a later run winning an area over an
    earlier one; each area rewritten -> its page.  Every area the runs have must have a
    block in some page, or no page is rewritten."""
    latest = {area: r for r in runs for area, (has, _) in AREAS.items() if has(r)}
    texts = {page: page.read_text() for page in pages}
    where = {m.group(2): page for page, t in texts.items() for m in BLOCK.finditer(t)}
    if missing := sorted(set(latest) - set(where)):
        raise ResultsError(f"no generated block for {', '.join(missing)} in any of the pages")
    blocks: dict[str, str] = {}
    for area, r in latest.items():
        blocks |= render(r, out, [area])
    for page, text in texts.items():
        if (new := rewrite(text, blocks)) != text:
            page.write_text(new)
    return {area: where[area] for area in blocks}


def saved_runs(results_dir: Path = RESULTS) -> list[Results]:
    """Every run in ``results_dir`` that records its provenance, oldest first (those
    that do not, from before it was recorded, are named on stderr and left out)."""
    runs = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            runs.append(load(path))
        except ResultsError as exc:
            print(f"skipped: {exc}", file=sys.stderr)
    return sorted(runs, key=lambda r: str(r["meta"]["provenance"]["date"]))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.page", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", type=Path, help="results, oldest first (default: all)")
    a = p.parse_args(argv)
    try:
        runs = [load(f) for f in a.files] if a.files else saved_runs()
        if not runs:
            raise ResultsError(f"no results in {RESULTS}: run a bench first (make bench)")
        for area, page in update(runs).items():
            print(f"{page.relative_to(ROOT)}: {area}")
    except ResultsError as exc:
        p.exit(1, f"python -m bench.page: error: {exc}\n")


if __name__ == "__main__":
    main()
