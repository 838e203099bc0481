"""``schemaless changes``: the change feed for operators, like ``kubectl get --watch``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from schemaless.errors import InvalidQuery, ShardUnavailable
from schemaless.feed import ChangeEvent, ChangeFeed, encode_cursor, open_feed
from schemaless.store import DataStore
from schemaless.subscriptions import feed_status
from schemaless.subscriptions import unsubscribe as unsubscribe_name

from .options import BadOption, Connection, needs_partial, pass_connection
from .output import (
    cell,
    echo_table,
    entity_to_json,
    human_duration,
    json_line,
    warn_unreachable,
)

__all__ = ["changes"]


def _part(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    """``K/N`` (1 <= K <= N) -> ``(K - 1, N)``, as the Cleaner's ``--part``."""
    if value is None:
        return None
    k, _, n = value.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise BadOption(f"expected K/N with 1 <= K <= N, got {value!r}", "--part")
    return int(k) - 1, int(n)


def _json(event: ChangeEvent) -> dict[str, object]:
    op = "snapshot" if event.seq is None else "delete" if event.entity is None else "put"
    return {
        "op": op,
        "id": event.id.hex(),
        "version": event.version,
        "shard": event.shard,
        "seq": event.seq,
        "at": event.at,
        "entity": None if event.entity is None else entity_to_json(event.entity),
        "cursor": event.cursor,
    }


def _text(event: ChangeEvent) -> str:
    at = datetime.fromtimestamp(event.at / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    where = f"{event.shard}:{event.seq if event.seq is not None else '-'}"
    if event.entity is None:
        return f"{at}  {where}  delete    {event.id.hex()}  v{event.version}"
    op = "snapshot" if event.seq is None else "put"
    body = {k: v for k, v in event.entity.items() if k != "id"}
    return f"{at}  {where}  {op:<8}  {event.id.hex()}  v{event.version}  {cell(body)}"


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new changes (Ctrl-C stops).")
@click.option("--since", "cursor", metavar="CURSOR", help="Start after this cursor.")
@click.option("--snapshot", is_flag=True, help="Every live entity first, then the changes since.")
@click.option("--part", callback=_part, metavar="K/N", help="Only the logical shards of part K.")
@click.option("--status", is_flag=True, help="The subscriptions' lag instead of the changes.")
@click.option(
    "--unsubscribe",
    metavar="NAME",
    help="Forget a subscription (the feed is no longer kept for it).",
)
@click.option(
    "--partial",
    is_flag=True,
    help="With a server down, the changes of the others (it is named on stderr; its "
    "shards resume from the cursor) instead of an error.",
)
@click.option("--json", "as_json", is_flag=True, help="JSON lines (with each event's cursor).")
@pass_connection
def changes(
    conn: Connection,
    follow: bool,
    cursor: str | None,
    snapshot: bool,
    part: tuple[int, int] | None,
    status: bool,
    unsubscribe: str | None,
    partial: bool,
    as_json: bool,
) -> None:
    """Show the change feed: puts and deletes in each logical shard's commit order.

    Without --follow it stops once it has caught up and prints the cursor to
    resume from on stderr; with --json every line carries its own cursor.  The
    datastore must have the feed on (`schemaless init --changes`).

    \b
    Example:
        schemaless changes --json
        schemaless changes --follow --since c1.eJxr...
        schemaless changes --status
        schemaless changes --unsubscribe indexer
    """
    stream = {"--follow": follow, "--since": cursor is not None, "--snapshot": snapshot}
    stream |= {"--part": part is not None, "--partial": partial}
    if unsubscribe is not None:
        _alone("--unsubscribe", {**stream, "--status": status, "--json": as_json})
    elif status:
        _alone("--status", stream)
    with conn.store() as ds:
        if unsubscribe is not None:
            n = unsubscribe_name(ds.cluster, unsubscribe)
            if not n:  # a typo: say so rather than "0 positions forgotten", exit 0
                raise click.ClickException(
                    f"no subscription {unsubscribe!r}: nothing forgotten"
                    " (`schemaless changes --status` lists them)"
                )
            click.echo(f"subscription {unsubscribe!r}: {n} positions forgotten")
            return
        if status:
            _status(ds, as_json)
            return
        try:
            feed = open_feed(ds.reader, cursor, snapshot=snapshot, part=part, partial=partial)
        except InvalidQuery as exc:
            raise BadOption(str(exc), "--since") from None
        _stream(feed, follow, as_json, cursor)


def _alone(mode: str, given: dict[str, bool]) -> None:
    """Refuse the options ``mode`` does not take (they used to be ignored)."""
    for name, on in given.items():
        if on:
            unknown = name == "--partial" and mode == "--status"
            why = ", which shows a server that does not answer as unknown" if unknown else ""
            raise BadOption(f"not with {mode}{why}", name)


def _stream(feed: ChangeFeed, follow: bool, as_json: bool, last: str | None) -> None:
    """Print the feed's events until caught up (or Ctrl-C), then the cursor to resume
    from (JSON lines carry their own), also before an error.  A partial feed names on
    stderr each server that stops answering, and again when it answers."""
    down: set[str] = set()

    def after_round(feed: ChangeFeed) -> None:
        for address, shards in sorted(feed.unreachable.items()):
            if address not in down:
                listed = ", ".join(map(str, shards))
                warn_unreachable([address], f"logical shards {listed}: their changes wait")
        for address in sorted(down - feed.unreachable.keys()):
            click.echo(f"{address} answers again", err=True)
        down.clear()
        down.update(feed.unreachable)

    last = last or encode_cursor(feed.positions)  # nothing to read yet: where it started
    try:
        for event in feed.events(follow, after_round):
            click.echo(json_line(_json(event)) if as_json else _text(event))
            last = event.cursor
    except KeyboardInterrupt:
        pass
    except ShardUnavailable as exc:
        _resume(last, as_json)
        if feed.partial:
            raise
        raise needs_partial(exc) from exc
    _resume(last, as_json)


def _resume(last: str, as_json: bool) -> None:
    if not as_json:
        click.echo(f"resume with: --since {last}", err=True)


def _status(ds: DataStore, as_json: bool) -> None:
    rows = feed_status(ds.cluster, partial=True)
    warn_unreachable(a for r in rows for a in r["unreachable"])
    if as_json:
        for row in rows:
            click.echo(json_line(row))
        return
    if not rows:
        click.echo("no subscriptions")
        return
    echo_table(
        ["subscription", "shards", "behind", "oldest unacked", "last ack"],
        [
            [
                r["name"],
                str(r["shards"]),
                *_lag(r),
                human_duration(r["acked_s"]) + " ago",
            ]
            for r in rows
        ],
    )


def _lag(row: dict[str, Any]) -> list[str]:
    """A subscription's ``behind`` and ``oldest unacked`` cells (``unknown`` when a
    server of its shards did not answer)."""
    if row["behind"] is None:
        return ["unknown", "unknown"]
    return [str(row["behind"]), human_duration(row["oldest_s"]) if row["behind"] else "-"]
