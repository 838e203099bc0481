"""docs/benchmarks.md's generated blocks: rewritten in place, dated, refused undated."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.page import AREAS, PAGES, ResultsError, load, render, rewrite, saved_runs, update
from bench.provenance import ROOT, command_line, commit

#: date, commit and command of a block's stamp
STAMP = re.compile(
    r"<sub>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC · commit `[0-9a-f]{7,}(?:\+dirty)?`"
    r" · `python -m bench[^`]*`"
)
BLOCK = re.compile(r"<!-- generated: (\w+)[^>]*-->\n(.*?)<!-- end generated: \1 -->", re.S)

PAGE = """# Benchmarks

Prose the tool never touches.

<!-- generated: layout (python -m bench.page) -->
old layout table
<!-- end generated: layout -->

More prose.

<!-- generated: timeline (python -m bench.page) -->
old timeline table
<!-- end generated: timeline -->
"""


def _layout_results(**provenance: Any) -> dict[str, Any]:
    """A layout bench's results, as ``write_results`` writes them (numbers made up)."""
    cell = {"p50_ms": 2.0, "p99_ms": 3.0}
    return {
        "meta": {
            "machine": {"servers": 2, "mariadb": "11.8.3-MariaDB", "durable": True, "nproc": 2},
            "provenance": {
                "date": "2026-11-27T15:31:22+00:00",
                "commit": "315915d",
                "command": "python -m bench.layout --per-server 8",
                "load_average": [1.5, 1.25, 1.0],
                **provenance,
            },
        },
        "sizes": [{"per_server": 8, "ops": {"get_many": {"a_union": cell, "b_key": cell}}}],
    }


def _write(path: Path, results: dict[str, Any]) -> Path:
    path.write_text(json.dumps(results))
    return path


def test_a_block_is_rewritten_in_place_and_the_rest_left_alone(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    done = update([load(_write(tmp_path / "l.json", _layout_results()))], [page], tmp_path)
    assert done == {"layout": page}
    text = page.read_text()
    assert "old layout table" not in text
    layout = dict(BLOCK.findall(text))["layout"]
    assert "| get_many | 2.00 | 1.00 |" in layout
    assert STAMP.search(layout)
    assert "commit `315915d` · `python -m bench.layout --per-server 8`" in layout
    assert "load average 1.5 / 1.25 / 1" in layout
    # everything outside the layout block, the timeline block included, is as it was
    assert BLOCK.sub("", text) == BLOCK.sub("", PAGE)
    assert dict(BLOCK.findall(text))["timeline"] == "old timeline table\n"
    # rendering the same file again changes nothing
    update([load(tmp_path / "l.json")], [page], tmp_path)
    assert page.read_text() == text


def test_rewrite_leaves_blocks_of_other_areas() -> None:
    assert rewrite(PAGE, {"core": "new\n"}) == PAGE
    assert "new\n<!-- end generated: timeline -->" in rewrite(PAGE, {"timeline": "new\n"})


@pytest.mark.parametrize("missing", ["commit", "date", "command"])
def test_a_results_file_without_its_provenance_is_refused(tmp_path: Path, missing: str) -> None:
    bad = _write(tmp_path / "bad.json", _layout_results(**{missing: ""}))
    with pytest.raises(ResultsError, match=rf"no {missing} recorded \(meta.provenance\).*rerun"):
        load(bad)
    # among the saved runs, it is left out (and named), the others used
    good = _layout_results(date="2026-11-27T16:00:00+00:00")
    _write(tmp_path / "good.json", good)
    _write(tmp_path / "older.json", _layout_results(commit="1234567"))
    runs = saved_runs(tmp_path)
    assert [r["meta"]["provenance"]["commit"] for r in runs] == ["1234567", "315915d"]


def test_an_area_without_a_block_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# no blocks\n")
    with pytest.raises(ResultsError, match="no generated block for layout"):
        update([load(_write(tmp_path / "l.json", _layout_results()))], [page], tmp_path)
    assert page.read_text() == "# no blocks\n"


def test_the_page_has_every_area_each_with_a_date_commit_and_command() -> None:
    text = "\n".join(page.read_text() for page in PAGES)
    blocks = dict(BLOCK.findall(text))
    assert set(AREAS) == set(blocks)
    for area, body in blocks.items():
        stamps = STAMP.findall(body)
        assert len(stamps) == 1, (area, body)
    for image in re.findall(r"\]\((results/[^)]+\.png)\)", text):
        assert (ROOT / "docs" / image).is_file(), image


def test_the_page_is_one_page() -> None:
    """The current figures only: each bench's generated block and the hand tables of
    the owned layout and of feeds and edges; every earlier run is in the history."""
    assert len((ROOT / "docs" / "benchmarks.md").read_text().splitlines()) < 335


def test_provenance_names_the_command_as_typed_and_the_commit() -> None:
    assert command_line([str(ROOT / "bench" / "__main__.py"), "--entities", "20000"]) == (
        "python -m bench --entities 20000"
    )
    assert command_line([str(ROOT / "bench" / "timeline.py"), "--scale", "0.05"]) == (
        "python -m bench.timeline --scale 0.05"
    )
    assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?|unknown", commit())


def test_the_latest_run_wins_and_a_partial_run_claims_no_table(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    older, newer = _layout_results(commit="1234567"), _layout_results(commit="89abcde")
    update([older, newer], [page], tmp_path)
    assert "commit `89abcde`" in page.read_text() and "1234567" not in page.read_text()
    get_only = {"meta": newer["meta"], "ops": [{"op": "get", "threads": 1}]}
    assert render(get_only, tmp_path) == {}  # `python -m bench --ops get` rewrites no table
