"""``schemaless index``: declare, list, watch and drop indexes."""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from schemaless import fit
from schemaless.catalog import IndexInfo, IndexState, backfill_job, now_us
from schemaless.deferrals import Deferrals
from schemaless.errors import IndexDefinitionError
from schemaless.index import Index, parse_type
from schemaless.store import DataStore

from .dry_run import show_dry_run
from .options import (
    BadOption,
    CliError,
    Connection,
    Group,
    follow_up,
    group_connection,
    pass_connection,
)
from .output import echo_table, human_duration, json_line, warn_unreachable
from .stats import (
    Backfill,
    Heartbeat,
    backfill,
    figure,
    heartbeats,
    max_added_ids,
)
from .where import literal

__all__ = ["index"]

_PROPERTY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_SHOW_SHARDS = 20
_LIVE_S = 30.0  # a Cleaner silent this long (six of its 5 s heartbeats) is not at work


def describe(idx: Index) -> str:
    """``user_id:uuid, published:int`` (then ``where kind='post'`` for a partial index)."""
    out = ", ".join(f"{p}:{t.name}" for p, t in zip(idx.properties, idx.types, strict=True))
    return out + (f" where {_filter_text(idx)}" if idx.filter else "")


def _filter_text(idx: Index) -> str:
    """A partial index's filter: ``kind='post' and n=3``."""
    return " and ".join(f"{prop}={value!r}" for prop, _, value in idx.filter)


def _check_filter(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, Any] | None:
    """``--where NAME=VALUE`` (repeatable) as a partial index's filter; a VALUE is
    read as ``query --where`` reads one for an ``auto`` column."""
    out: dict[str, Any] = {}
    for spec in values:
        name, sep, text = spec.partition("=")
        name = name.strip()
        if not sep or not _PROPERTY.match(name):
            raise BadOption(f"{spec!r}: expected NAME=VALUE (NAME may be a path a.b)", "--where")
        if name in out:
            raise BadOption(f"{spec!r}: a second value for {name!r}", "--where")
        try:
            out[name] = literal(text, "auto")
        except ValueError as exc:
            raise BadOption(f"{spec!r}: {exc}", "--where") from None
    return out or None


def _when(us: int) -> str:
    moment = datetime.fromtimestamp(us / 1e6, UTC)
    ago = human_duration((now_us() - us) / 1e6)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC ({ago} ago)"


def _percent(fraction: float | None) -> str:
    return "unknown" if fraction is None else f"{100 * fraction:.1f}%"


def _check_properties(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[str]:
    out = []
    for spec in values:
        name, sep, type_text = spec.partition(":")
        name = name.strip()
        if not _PROPERTY.match(name):
            raise BadOption(
                f"{spec!r}: a property is NAME or NAME:TYPE, NAME of letters, digits and '_' "
                "(a nested path: NAME.NAME, e.g. author.id)",
                "--property",
            )
        if sep:
            try:
                parse_type(type_text)
            except IndexDefinitionError as exc:
                raise BadOption(f"{spec!r}: {exc}", "--property") from None
        out.append(f"{name}:{type_text.strip()}" if sep else name)
    return out


@click.group(cls=Group)
@group_connection
def index() -> None:
    """Declare, list, watch and drop indexes.

    \b
    Example:
        schemaless index create by_user --property user_id:uuid \\
            --property published:int --shard-on user_id
        schemaless index status by_user
    """


@index.command()
@click.argument("name")
@click.option(
    "--property",
    "properties",
    multiple=True,
    required=True,
    metavar="NAME[:TYPE]",
    callback=_check_properties,
    help="An indexed property, in index order (repeatable). TYPE: uuid, int, float, "
    "bool, str(N), bytes(N) or auto (the default: any scalar).",
)
@click.option("--shard-on", metavar="NAME", help="Property that places the rows (default: first).")
@click.option("--multi", metavar="NAME", help="A list-valued property: one row per element.")
@click.option(
    "--where",
    "filter_",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_check_filter,
    help="A partial index: rows only for entities whose NAME (a property or path) "
    "equals VALUE (repeatable: all must hold). VALUE as in `query --where`.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Declare nothing: sample the stored entities and estimate the index rows, "
    "size, unindexable entities (with examples) and the backfill's ETA.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@click.option(
    "--force",
    is_flag=True,
    help="Declare it even if sampled entities have values that do not fit the types or "
    "(--unique) share a value: it then stays building until they are fixed.",
)
@click.option(
    "--unique",
    is_flag=True,
    help="At most one live entity per tuple of values (a put that would share one fails "
    "with UniqueViolation).",
)
@pass_connection
def create(
    conn: Connection,
    name: str,
    properties: list[str],
    shard_on: str | None,
    multi: str | None,
    filter_: dict[str, Any] | None,
    dry_run: bool,
    as_json: bool,
    force: bool,
    unique: bool,
) -> None:
    """Declare an index: create its table on every shard and record it.

    On a datastore that holds entities the index is "building": writers maintain
    it from their next catalog refresh, queries refuse it until the Cleaner has
    backfilled it (run `cleaner --index=NAME`, watch `schemaless index status
    NAME`).  On an empty datastore it is ready at once.  Declaring the same index
    again changes nothing.  Quote types with parentheses for the shell.  With
    --dry-run nothing is declared: a sample of the stored entities tells how
    many rows the index would hold, its size, which entities have values that
    do not fit the types, and how long the backfill would take.  Without --dry-run
    the same kind of sample is checked first: if entities have values that do not
    fit the types or (--unique) share a value, nothing is declared and the command
    exits 1 with counts and examples; --force declares it anyway, and it stays
    building (`index status` shows why) until they are fixed and the backfill runs
    again.  Writes never fail because of a building index.

    \b
    Example:
        schemaless index create by_user --property user_id:uuid \\
            --property published:int --shard-on user_id --dry-run
        schemaless index create by_user --property user_id:uuid \\
            --property published:int --shard-on user_id
        schemaless index create by_tag --property tags:'str(64)' --multi tags
        schemaless index create by_email --property email:'str(254)' --unique
        schemaless index create posts_by_user --property user_id:uuid --where kind=post
    """
    definition = _definition(name, properties, shard_on, multi, unique, filter_)
    with conn.store() as ds:
        if dry_run:
            show_dry_run(ds, definition, as_json)
            return
        topo = ds.cluster.refresh()
        existed = topo.indexes.get(name)
        if existed is None and not force and not topo.moves:  # a move: refused below
            _check_fit(ds, definition)
        state = ds.declare_index(definition, force=True)  # checked above
        refresh = ds.cluster.topology.refresh_interval
    if as_json:
        click.echo(
            json.dumps(
                {
                    "definition": definition.to_dict(),
                    "existed": existed is not None,
                    "state": state,
                },
                sort_keys=True,
            )
        )
        return
    _echo_created(definition, existed is not None, state, refresh)


def _check_fit(ds: DataStore, definition: Index) -> None:
    """Refuse an index that a sample of the stored entities does not fit: the examples
    on stdout, the counts as the error."""
    found = fit.sample(ds.cluster, ds.decode, definition)
    if not found.fits:
        click.echo(f"index {definition.name}: nothing declared; e.g.")
        for line in found.examples():
            click.echo(line)
        raise CliError(found.summary())


def _definition(
    name: str,
    properties: list[str],
    shard_on: str | None,
    multi: str | None,
    unique: bool,
    filter_: dict[str, Any] | None = None,
) -> Index:
    """The index ``index create`` declares; a bad option is named."""
    names = [p.partition(":")[0] for p in properties]
    for option, value in (("--shard-on", shard_on), ("--multi", multi)):
        if value is not None and value not in names:
            raise BadOption(
                f"{value!r} is not one of the --property names ({', '.join(names)})", option
            )
    try:
        Index(name, ["x"])  # the name alone
    except IndexDefinitionError as exc:
        raise BadOption(str(exc), "NAME") from None
    definition = Index(name, properties, shard_on, multi=multi, unique=unique)
    if filter_ is None:
        return definition
    try:
        return Index(name, properties, shard_on, multi=multi, unique=unique, where=filter_)
    except IndexDefinitionError as exc:
        raise BadOption(str(exc), "--where") from None


def _echo_created(definition: Index, existed: bool, state: str, refresh: float) -> None:
    """What ``index create`` did, and what to run next."""
    name, multi, unique = definition.name, definition.multi, definition.unique
    click.echo(
        f"index {name}: {describe(definition)}, shard on {definition.shard_on}"
        + (f", multi {multi}" if multi else "")
        + (", unique" if unique else "")
    )
    if existed:
        click.echo(f"index {name} already exists and is {state}; nothing changed")
    elif state == IndexState.READY:
        click.echo(f"index {name} is ready (no entities to backfill): queries can use it now")
    else:
        click.echo(
            f"index {name} is building: writers maintain it within {refresh:g}s; "
            "queries refuse it until it is backfilled"
        )
    if state == IndexState.BUILDING:
        click.echo("next: backfill it with the Cleaner, then watch it:")
        click.echo("  " + follow_up("cleaner", f"--index={name}"))
        click.echo("  " + follow_up("schemaless index status", name))


@index.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="JSON lines, for scripts.")
@pass_connection
def list_(conn: Connection, as_json: bool) -> None:
    """List the indexes with their state and backfill progress.

    \b
    Example:
        schemaless index list
    """
    with conn.store() as ds:
        infos = sorted(ds.indexes().values(), key=lambda i: i.index.name)
        progress, unreachable = _overall(ds, [i for i in infos if i.state == IndexState.BUILDING])
    warn_unreachable(unreachable)
    if as_json:
        for info in infos:
            out = _info_json(info)
            out["backfill"] = (
                progress.get(info.index.name)
                if info.state == IndexState.BUILDING
                else (1.0 if info.state == IndexState.READY else None)
            )
            click.echo(json_line(out))
        return
    if not infos:
        click.echo("no indexes: declare one with `schemaless index create`")
        return
    rows = []
    for info in infos:
        idx = info.index
        if info.state == IndexState.BUILDING:
            done = _percent(progress.get(info.index.name))
        else:
            done = "100%" if info.state == IndexState.READY else "-"
        rows.append([idx.name, info.state, done, describe(idx), idx.shard_on, idx.multi or "-"])
    echo_table(["name", "state", "backfill", "properties", "shard on", "multi"], rows)


def _overall(ds: DataStore, building: list[IndexInfo]) -> tuple[dict[str, float | None], list[str]]:
    """Overall backfill fraction of each building index (the maxima read once), and
    the servers that did not answer."""
    if not building:
        return {}, []
    tops = max_added_ids(ds, ds.cluster.current())
    snaps = [backfill(ds, i.index.name, tops) for i in building]
    return {s.index: s.fraction for s in snaps}, snaps[0].unreachable


def _info_json(info: IndexInfo) -> dict[str, Any]:
    return {
        "name": info.index.name,
        "state": info.state,
        "definition": info.index.to_dict(),
        "created_us": info.created,
        "changed_us": info.changed,
    }


@index.command()
@click.argument("name")
@click.option(
    "--watch",
    type=click.FloatRange(min=0.1),
    metavar="SECONDS",
    help="Show it again every SECONDS until the index is no longer building (rows/s "
    "and ETA measured between the views).",
)
@click.option("--all-shards", is_flag=True, help="List every shard, not only unfinished ones.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@pass_connection
def status(
    conn: Connection, name: str, watch: float | None, all_shards: bool, as_json: bool
) -> None:
    """Show an index: state, definition, backfill progress per shard, the Cleaner.

    Progress of a shard is the Cleaner's checkpoint (the last added_id it
    backfilled) over the shard's highest added_id.  Rows/s and ETA come from the
    Cleaner's heartbeat, or are measured with --watch; "unknown" when neither
    says.  The orphan backlog and last heartbeat are what the Cleaner reported.

    \b
    Example:
        schemaless index status by_user
        schemaless index status by_user --watch 5
    """
    with conn.store() as ds:
        first: Backfill | None = None
        while True:
            info = ds.cluster.refresh().indexes.get(name)
            if info is None:
                known = ", ".join(sorted(ds.indexes())) or "none"
                raise BadOption(f"no index named {name!r} (indexes: {known})", "NAME")
            snap = backfill(ds, name) if info.state == IndexState.BUILDING else None
            beats = heartbeats(ds)
            first = first or snap
            report = _report(info, snap, first, beats)
            if info.index.unique:
                report["duplicates"] = _duplicates(ds, name)
            if info.state == IndexState.BUILDING:
                report["blocked"] = _blocked(ds, name)
                report["deferred"] = _deferred(ds, name)
            if as_json:
                click.echo(json.dumps(report, sort_keys=True))
            else:
                if watch and first is not snap:
                    if sys.stdout.isatty():
                        click.clear()
                    else:
                        click.echo()
                _echo_report(report, snap, all_shards)
            warn_unreachable(snap.unreachable if snap is not None else ())
            if not watch or info.state != IndexState.BUILDING:
                return
            time.sleep(watch)


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
        eta = remaining / rate if remaining is not None and rate > 0 else None
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


def _report(
    info: IndexInfo, snap: Backfill | None, first: Backfill | None, beats: list[Heartbeat]
) -> dict[str, Any]:
    name = info.index.name
    out = _info_json(info)
    if snap is not None:
        rate, eta, source = _rate(info, snap, first, beats)
        out["backfill"] = {
            "fraction": snap.fraction,
            "rows": snap.rows,
            "remaining_rows": snap.remaining,
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
            f"backfill: {_percent(bf['fraction'])} scanned, "
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
                _percent(s.fraction),
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


def _echo_report(report: dict[str, Any], snap: Backfill | None, all_shards: bool) -> None:
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


@index.command()
@click.argument("name")
@click.option("--purge", is_flag=True, help="Also remove its tables and forget it.")
@pass_connection
def drop(conn: Connection, name: str, purge: bool) -> None:
    """Drop an index: writers stop maintaining it, queries refuse it.

    Writers stop at their next catalog refresh.  With --purge (now or later)
    the index tables are removed from every shard and the name can be declared
    again.

    \b
    Example:
        schemaless index drop by_link
        schemaless index drop by_link --purge
    """
    with conn.store() as ds:
        info = ds.indexes().get(name) or ds.cluster.refresh().indexes.get(name)
        if info is None:
            known = ", ".join(sorted(ds.indexes())) or "none"
            raise BadOption(f"no index named {name!r} (indexes: {known})", "NAME")
        if info.state != IndexState.DROPPED:
            ds.drop_index(name)
            click.echo(f"index {name} dropped: writers stop maintaining it at their next refresh")
        elif not purge:
            click.echo(f"index {name} was already dropped; --purge removes its tables")
        if purge:
            ds.purge_index(name)
            click.echo(f"index {name} purged: its tables are gone from every shard")
