"""``schemaless index create ... --dry-run``: what a backfill would find, nothing declared.

The figures come from a sample of the stored entities (``schemaless.cleaner.estimate``:
the backfill's own scan and row building); they are estimates unless every entity row
was read.
"""

from __future__ import annotations

import json
from typing import Any

import click

from schemaless.cleaner.estimate import estimate  # type: ignore[import-not-found, unused-ignore]
from schemaless.index import Index
from schemaless.store import DataStore

from .options import CliError
from .output import human_bytes, human_duration, warn_unreachable

__all__ = ["show_dry_run"]

_SHOW = 100  # characters of an example's message


def show_dry_run(ds: DataStore, definition: Index, as_json: bool) -> None:
    """Print what declaring ``definition`` would do; declare nothing."""
    name = definition.name
    existing = ds.cluster.refresh().indexes.get(name)
    if existing is not None and existing.index != definition:
        raise CliError(
            f"index {name!r} already exists with a different definition: "
            f"{existing.index!r}; create would fail (drop and purge it first)"
        )
    report: dict[str, Any] = estimate(ds, definition, partial=True).as_dict()
    report["exists"] = None if existing is None else existing.state
    warn_unreachable(report["unreachable"], "its shards are not in these figures")
    if as_json:
        click.echo(json.dumps(report, sort_keys=True))
        return
    for line in _lines(report):
        click.echo(line)


def _n(value: float, exact: bool) -> str:
    return f"{value:,.0f}" if exact else f"~{value:,.0f}"


def _head(r: dict[str, Any]) -> list[str]:
    """The report's first lines: the index, whether it exists, the shards not sampled,
    and (alone) that nothing is stored."""
    name = r["index"]["name"]
    out = [f"dry run: index {name}: nothing declared"]
    if r["exists"] is not None:
        out.append(f"  index {name} already exists and is {r['exists']}: create changes nothing")
    if r["missing_shards"]:
        out.append(
            f"  not sampled  {len(r['missing_shards'])} of {r['shards']} shards, on"
            f" {', '.join(r['unreachable'])}, which did not answer: the figures below leave"
            " their entities out, and create fails until every server answers"
        )
    if not r["stored_rows"]:
        where = "on the shards that answered" if r["missing_shards"] else "stored"
        ready = "" if r["missing_shards"] else f": {name} would be ready at once"
        out.append(f"  no entities {where}{ready}")
    return out


def _lines(r: dict[str, Any]) -> list[str]:
    exact = r["exact"]
    when = r["as_of"][11:19] + " UTC"
    out = _head(r)
    if not r["stored_rows"]:
        return out
    how = "every row: figures exact" if exact else "a sample: figures estimated"
    shards = r["shards"] - len(r["missing_shards"])
    out.append(f"  sampled      {r['sampled_rows']:,} entity rows on {shards} shards ({how})")
    out.append(f"               of the rows stored at {when}: rows written since are not in them")
    tombstones = r["stored_rows"] - r["entities"]
    out.append(
        f"  entities     {_n(r['entities'], exact)} live, {_n(tombstones, exact)} tombstones"
    )
    per, bare = r["rows_per_entity"], r["entities_without_rows"]
    lack = "entity lacks" if exact and bare == 1 else "entities lack"
    out.append(
        f"  index rows   {_n(r['index_rows'], exact)} ({per or 0:.2f} per entity; "
        f"{_n(bare, exact)} {lack} a property: no row)"
    )
    out.append(
        f"  index size   ~{human_bytes(r['size_bytes'])} (an estimate from the sampled values:"
        " both B-trees, pages 70% full)"
    )
    out += _problems(r, exact)
    eta, grace = human_duration(r["eta_s"]), human_duration(r["grace_s"])
    rows, rate = _n(r["stored_rows"], exact), r["rows_per_s"] or 0
    out.append(f"  backfill ETA {eta}: {grace} grace, then {rows} rows at {rate:,.0f} rows/s")
    out.append("               (the sample's pace in one process: read, decode, rows; no writes;")
    out.append("               rows written before the backfill starts add to its rows)")
    if r["unindexable"] or r["duplicates_in_sample"]:
        out.append(
            "the index could not become ready until these are fixed: create refuses it"
            " (--force declares it anyway)"
        )
    elif r["corrupt"]:
        out.append("the backfill sets these entities aside: logged and counted, not indexed")
    return out


def _problems(r: dict[str, Any], exact: bool) -> list[str]:
    """The sample's misfits, duplicates and corrupt entities, with examples."""
    out: list[str] = []
    if r["unindexable"]:
        out.append(
            f"  unindexable  {100 * r['unindexable_share']:.1f}% of entities "
            f"({_n(r['unindexable'], exact)}): values that do not fit the column types, e.g."
        )
    else:
        out.append("  unindexable  none: every value fits its column's type")
    for e in r["examples"]:
        message = e["message"]
        message = message if len(message) <= _SHOW else message[: _SHOW - 3] + "..."
        out.append(f"    entity {e['entity_id']} on shard {e['shard']}: {message}")
    if r["duplicates_in_sample"]:
        out.append(
            f"  duplicates   {r['duplicates_in_sample']:,} sampled entities share a value of the"
            " unique index with another, e.g."
        )
        for e in r["duplicate_examples"]:
            out.append(f"    entity {e['entity_id']} on shard {e['shard']}: {e['message']}")
    if r["corrupt"]:
        out.append(f"  corrupt      {_n(r['corrupt'], exact)} entities cannot be decoded")
    return out
