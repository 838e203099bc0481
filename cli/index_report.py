"""What ``schemaless index status`` shows: an index's state, definition, backfill
progress (per shard, rate and ETA), the Cleaners at work, and what keeps a building
index from becoming ready (duplicates, blocks, deferred rows)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from schemaless.catalog import IndexInfo, IndexState, backfill_job, now_us
from schemaless.deferrals import Deferrals
from schemaless.index import Index
from schemaless.store import DataStore

from .options import follow_up
from .output import echo_table, human_duration
from .stats import Backfill, Heartbeat, figure

__all__ = ["describe", "echo_report", "index_report", "info_json", "percent"]

_SHOW_SHARDS = 20
_LIVE_S = 30.0  # a Cleaner silent this long (six of its 5 s heartbeats) is not at work


def index_report(
    ds: DataStore,
    info: IndexInfo,
    snap: Backfill | None,
    first: Backfill | None,
    beats: list[Heartbeat],
) -> dict[str, Any]:
    """What ``index status`` shows of an index, as JSON-ready data (``snap``: its
    backfill now, ``first``: at the first view of a ``--watch``)."""
    out = _figures(info, snap, first, beats)
    name = info.index.name
    if info.index.unique:
        out["duplicates"] = _duplicates(ds, name)
    if info.state == IndexState.BUILDING:
        out["blocked"] = _blocked(ds, name)
        out["deferred"] = _deferred(ds, name)
    return out


def describe(idx: Index) -> str:
    """``user_id:uuid, published:int`` (then ``where kind='post'`` for a partial index,
    ``, counted`` for a counted one)."""
    out = ", ".join(f"{p}:{t.name}" for p, t in zip(idx.properties, idx.types, strict=True))
    out += f" where {_filter_text(idx)}" if idx.filter else ""
    return out + (", counted" if idx.counted else "")


def _filter_text(idx: Index) -> str:
    """A partial index's filter: ``kind='post' and n=3``."""
    return " and ".join(f"{prop}={value!r}" for prop, _, value in idx.filter)


def _when(us: int) -> str:
    moment = datetime.fromtimestamp(us / 1e6, UTC)
    ago = human_duration((now_us() - us) / 1e6)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC ({ago} ago)"


def percent(fraction: float | None) -> str:
    return "unknown" if fraction is None else f"{100 * fraction:.1f}%"


def info_json(info: IndexInfo) -> dict[str, Any]:
    return {
        "name": info.index.name,
        "state": info.state,
        "definition": info.index.to_dict(),
        "created_us": info.created,
        "changed_us": info.changed,
    }


def _rate(
    info: IndexInfo, snap: Backfill | None, first: Backfill | None, beats: list[Heartbeat]
) -> tuple[float | None, float | None, str]:
    """(rows/s, ETA seconds, where the figure came from)."""
    name = info.index.name
    if snap is None:
        return None, None, ""
    remaining = snap.remaining
    if first is not None and snap is not first and snap.taken > first.taken:
        elapsed = snap.taken - first.taken
        rows = (snap.rows - first.rows) / elapsed
        scanned = (snap.scanned - first.scanned) / elapsed
        eta = remaining / scanned if remaining is not None and scanned > 0 else None
        return rows, (0.0 if remaining == 0 else eta), f"measured over {human_duration(elapsed)}"
    fresh = [b for b in beats if _live(b)]
    found = _rates([b for b in fresh if _backfills(b, name)], name, scoped=False)
    if not found:  # a continuous Cleaner's figure, if it is about this index
        found = _rates([b for b in fresh if not _backfills(b, name)], name, scoped=True)[:1]
    if found:
        rate = sum(r for _, r in found)
        left = snap.remaining_rows  # the rate is in rows, not added_id values
        eta = left / rate if left is not None and rate > 0 else None
        source = (
            f"from {found[0][0]}'s heartbeat"
            if len(found) == 1
            else f"sum of {len(found)} parts' heartbeats"
        )
        return rate, (0.0 if remaining == 0 else eta), source
    return None, (0.0 if remaining == 0 else None), ""


def _live(beat: Heartbeat) -> bool:
    """Whether a heartbeat is of a Cleaner still at work: recent, and not stopped."""
    return beat.age < _LIVE_S and beat.figures.get("state") not in ("stopped", "done")


def _stopped(beats: list[Heartbeat], index: str) -> str | None:
    """When no Cleaner backfilling the index is at work: the last one's last word."""
    mine = [b for b in beats if _backfills(b, index)]  # the newest first
    if not mine or any(_live(b) for b in mine):
        return None
    state = mine[0].figures.get("state")
    said = "stopped" if state in ("stopped", "done") else "silent"
    return f"{mine[0].name} {said}, last seen {human_duration(mine[0].age)} ago"


def _rates(beats: list[Heartbeat], index: str, *, scoped: bool) -> list[tuple[str, float]]:
    """``(name, rows/s)`` of the heartbeats that report a rate (``scoped``: only a rate
    reported for this index)."""
    out = []
    for beat in beats:
        rate = figure(beat.figures, index, "rows_per_s", "rows_per_second", scoped=scoped)
        if rate is not None:
            out.append((beat.name, float(rate)))
    return out


def _figures(
    info: IndexInfo, snap: Backfill | None, first: Backfill | None, beats: list[Heartbeat]
) -> dict[str, Any]:
    name = info.index.name
    out = info_json(info)
    if snap is not None:
        rate, eta, source = _rate(info, snap, first, beats)
        out["backfill"] = {
            "fraction": snap.fraction,
            "rows": snap.rows,
            "remaining_rows": snap.remaining_rows,
            "rows_per_s": rate,
            "eta_s": eta,
            "rate_source": source or None,
            "stopped": None if source.startswith("measured") else _stopped(beats, name),
            "shards_done": snap.shards_done,
            "shards": [
                {
                    "shard": s.shard,
                    "server": s.server,
                    "position": s.position,
                    "min_added_id": s.before + 1,  # owned layout: past 1
                    "max_added_id": s.top,
                    "fraction": s.fraction,
                    "rows": s.rows,
                    "done": s.done,
                    "checkpoint_us": s.updated_us,
                }
                for s in snap.shards
            ],
        }
    else:
        out["backfill"] = {"fraction": 1.0 if info.state == IndexState.READY else None}
    out["daemons"] = [_daemon(b, name) for b in beats if _concerns(b, name)]
    return out


def _duplicates(ds: DataStore, name: str) -> dict[str, Any]:
    """The duplicates the last backfill of a unique index recorded: how many, and the
    values with the ids that share each (as many as the catalog kept)."""
    found = ds.cluster.catalog.duplicates(name)
    shared: dict[str, tuple[dict[str, Any], set[str]]] = {}
    for _, shown in found.values():
        for item in shown:
            key = json.dumps(item["values"], sort_keys=True)
            shared.setdefault(key, (item["values"], set()))[1].update(item["ids"])
    return {
        "count": sum(count for count, _ in found.values()),
        "values": [
            {"values": values, "ids": sorted(ids)} for _, (values, ids) in sorted(shared.items())
        ],
    }


def _blocked(ds: DataStore, name: str) -> dict[str, Any]:
    """What keeps a building index from becoming ready besides duplicates: writes that
    met it with values it cannot hold, and entities its backfill set aside."""
    (writes, shown), unfit = ds.cluster.catalog.blocks(name)
    return {
        "writes": writes,
        "unfit": sum(count for count, _ in unfit.values()),
        "examples": shown + [e for _, (_, some) in sorted(unfit.items()) for e in some][:10],
    }


def _deferred(ds: DataStore, name: str) -> list[dict[str, Any]]:
    """The rows the backfill deferred (their target's server was down), per source and
    target logical shard, with the target's server."""
    topo = ds.cluster.current()
    return [
        {
            "source": d.source,
            "target": d.target,
            "server": str(topo.servers[topo.shard_servers[d.target]]),
            "after_added_id": d.after,
            "upto_added_id": d.upto,
        }
        for d in Deferrals(ds.cluster.catalog).of(name)
    ]


def _echo_deferred(deferred: list[dict[str, Any]]) -> None:
    """One line per server that rows wait for."""
    targets: dict[str, set[int]] = {}
    sources: dict[str, set[int]] = {}
    for d in deferred:
        targets.setdefault(d["server"], set()).add(d["target"])
        sources.setdefault(d["server"], set()).add(d["source"])
    for server in sorted(targets):
        click.echo(
            f"deferred: rows for {len(targets[server])} logical shard(s) on {server} "
            f"(from {len(sources[server])} scanned shard(s)) wait for that server; the "
            "backfill writes them when it answers, then the index can become ready"
        )


def _echo_blocked(name: str, blocked: dict[str, Any]) -> None:
    if not blocked["writes"] and not blocked["unfit"]:
        return
    click.echo(
        f"blocked: it cannot become ready: writes met it with values it cannot hold (no row "
        f"written; {blocked['writes']:,} recorded, once per client process), "
        f"{blocked['unfit']:,} entities set aside by the backfill; e.g."
    )
    for e in blocked["examples"]:
        click.echo(f"  entity {e['entity_id']}: {e['why']}")
    click.echo(
        "  fix them (change or delete those entities) and run the backfill again "
        f"(`cleaner --index={name}`, as a user that may create tables: it scans every "
        "shard again), or drop the index"
    )


def _echo_duplicates(dups: dict[str, Any]) -> None:
    if not dups["count"]:
        return
    click.echo(
        f"duplicates: {dups['count']} entities share a value with another live entity; "
        "the index stays building until they are resolved (delete or change one of "
        "each), then run the backfill again"
    )
    rows = [
        [", ".join(f"{k}={v!r}" for k, v in d["values"].items()), " ".join(d["ids"])]
        for d in dups["values"]
    ]
    echo_table(["value", "entity ids"], rows)
    if len(rows) < dups["count"]:
        click.echo("  (the catalog keeps only some of them per shard)")


def _concerns(beat: Heartbeat, index: str) -> bool:
    """Whether a heartbeat matters to an index: its own backfill, or a continuous Cleaner."""
    return not beat.name.startswith("backfill:") or _backfills(beat, index)


def _backfills(beat: Heartbeat, index: str) -> bool:
    """Whether a heartbeat is a Cleaner backfilling this index, alone or as one part
    (``backfill:<index>:K/N``)."""
    job = backfill_job(index)
    return beat.name == job or beat.name.startswith(job + ":")


def _daemon(beat: Heartbeat, index: str) -> dict[str, Any]:
    backfilling = beat.name.startswith("backfill:")
    last_pass = figure(beat.figures, None, "last_pass")
    return {
        "name": beat.name,
        "heartbeat_age_s": round(beat.age, 3),
        "state": beat.figures.get("state"),
        "orphan_backlog": None
        if backfilling
        else figure(beat.figures, index, "orphan_backlog", "backlog"),
        "rows_backfilled": figure(beat.figures, index, "rows_backfilled"),
        "last_pass_age_s": round((now_us() - last_pass) / 1e6, 3) if last_pass else None,
        "throttle": beat.figures.get("throttle") or None,
        "throttle_limit": figure(beat.figures, None, "throttle_limit"),
        "figures": beat.figures,
    }


def _echo_backfill(report: dict[str, Any], snap: Backfill | None, all_shards: bool) -> None:
    """The backfill's progress, and its shards (the unfinished ones unless all)."""
    name, state = report["name"], report["state"]
    bf = report["backfill"]
    if snap is None:
        click.echo("backfill: " + ("done" if state == IndexState.READY else "none (dropped)"))
    else:
        rate = bf["rows_per_s"]
        rate_text = "unknown" if rate is None else f"{rate:,.0f} rows/s ({bf['rate_source']})"
        click.echo(
            f"backfill: {percent(bf['fraction'])} scanned, "
            f"{len(snap.shards) - bf['shards_done']} of {len(snap.shards)} shards still "
            f"to scan, {bf['rows']:,} rows added"
        )
        eta = bf["eta_s"]
        eta_text = human_duration(eta) if eta is not None else "unknown"
        if rate is None and bf["stopped"]:
            click.echo(f"  no Cleaner at work: {bf['stopped']} (no rate, no ETA)")
        else:
            click.echo(f"  rate {rate_text}, ETA {eta_text}")
        if rate is None and not bf["stopped"]:
            click.echo(f"  (measure it: schemaless index status {name} --watch 5)")
        shown = [s for s in snap.shards if all_shards or s.fraction != 1.0]
        rows = [
            [
                str(s.shard),
                s.server,
                f"{s.position}",
                "unknown" if s.top is None else str(s.top),
                percent(s.fraction),
                f"{s.rows:,}",
                "yes" if s.done else "no",
                "never"
                if s.updated_us is None
                else human_duration((now_us() - s.updated_us) / 1e6) + " ago",
            ]
            for s in shown[: None if all_shards else _SHOW_SHARDS]
        ]
        if rows:
            echo_table(
                [
                    "shard",
                    "server",
                    "position",
                    "max added_id",
                    "progress",
                    "rows",
                    "done",
                    "checkpoint",
                ],
                rows,
                right=["shard", "position", "max added_id", "progress", "rows"],
            )
        hidden = len(snap.shards) - len(rows)
        if hidden:
            click.echo(f"  ({hidden} more shards, finished or not shown: --all-shards lists all)")


def _echo_daemons(daemons: list[dict[str, Any]]) -> None:
    """One line a Cleaner process whose heartbeat the catalog holds."""
    if not daemons:
        click.echo("cleaner: no heartbeat in the catalog (has `cleaner` run yet?)")
    for b in daemons:
        doing = f" ({b['state']})" if isinstance(b["state"], str) else ""
        parts = [f"last heartbeat {human_duration(b['heartbeat_age_s'])} ago"]
        if b["name"].startswith("backfill:"):
            if b["rows_backfilled"] is not None:
                parts.append(f"{b['rows_backfilled']:,} rows backfilled by this run")
        else:
            backlog = b["orphan_backlog"]
            parts.append(f"orphan backlog {'unknown' if backlog is None else f'{backlog:,}'}")
            if b["last_pass_age_s"] is not None:
                parts.append(f"last pass {human_duration(b['last_pass_age_s'])} ago")
        pending = b["figures"].get("pending_shards")
        if pending:
            parts.append(f"{pending} logical shard(s) pending (server unavailable)")
        if b["throttle_limit"] is not None:
            parts.append(f"limit {b['throttle_limit']:,.0f} rows/s")
        if b["throttle"]:
            parts.append(str(b["throttle"]))
        click.echo(f"{b['name']}{doing}: " + ", ".join(parts))


def echo_report(report: dict[str, Any], snap: Backfill | None, all_shards: bool) -> None:
    d = report["definition"]
    name, state = report["name"], report["state"]
    click.echo(f"index {name}: {state}")
    props = ", ".join(f"{p}:{t}" for p, t in d["properties"])
    click.echo(f"  properties  {props}")
    click.echo(f"  shard on    {d['shard_on']}")
    click.echo(f"  multi       {d['multi'] or '-'}")
    if d.get("unique"):
        click.echo("  unique      yes")
    if d.get("where"):
        click.echo(f"  where       {_filter_text(Index.from_dict(d))}")
    click.echo(f"  declared    {_when(report['created_us'])}")
    click.echo(f"  changed     {_when(report['changed_us'])}")
    _echo_backfill(report, snap, all_shards)
    if "duplicates" in report:
        _echo_duplicates(report["duplicates"])
    if "blocked" in report:
        _echo_blocked(name, report["blocked"])
    _echo_deferred(report.get("deferred", []))
    _echo_daemons(report["daemons"])
    if state == IndexState.BUILDING:
        click.echo("next: " + follow_up("cleaner", f"--index={name}"))
