"""The diagnosis of a missed acknowledged write in the consumer crash test
(``test_consumer_crash.py``): what its key and its logical shard went through, in the
failure's message, so that a failure seen once (in CI, its servers gone) can be read.

It reports, for the first missing write's key: its acknowledged writes and the events
every consumer run logged for it; for its shard, each run's sequence numbers, servers
and acknowledgements, numbers delivered with two different changes (a number given out
twice), numbers never delivered, the moves', kills' and trims' times; and what every
server holds now: its ``owned`` rows, the shard's head, the key's entity and change rows,
the shard's change rows and entities, and the next ``added_id`` it would give.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemaless import DataStore
from schemaless.errors import SchemalessError
from schemaless.names import quote
from schemaless.owned import admin

__all__ = ["explain"]

_SHOWN = 40  # at most this many lines of one list


def explain(
    missing: Sequence[Any],
    acked: Sequence[Any],
    records: Sequence[dict[str, Any]],
    store: DataStore,
    timeline: Sequence[tuple[float, str]],
) -> str:
    """The failure's message: ``missing`` acknowledged writes ``(id, op, version, t)``
    of ``acked``, the consumer's log ``records``, the test's ``timeline``."""
    t0 = min([t for t, _ in timeline] + [op[3] for op in acked] or [0.0])
    key, op, version, at = missing[0]
    shard = store.cluster.shard_of_id(key)
    lines = [
        f"{len(missing)} acknowledged write(s) never seen, e.g. "
        + ", ".join(f"{k.hex()} {o} v{v} at {t - t0:.3f}s" for k, o, v, t in missing[:5]),
        f"key {key.hex()}, {op} v{version} acknowledged at {at - t0:.3f}s, logical shard {shard}",
        "acknowledged writes of the key, the last ten before it and three after: "
        + ", ".join(f"{o} v{v} at {t - t0:.3f}s" for _, o, v, t in _around(acked, missing[0])),
        "events of the key (run, version, deleted, shard, seq, time, server and map version):",
    ]
    lines += _listed(
        f"  {r['run']} v{r['v']} {'del' if r['del'] else 'put'} shard {r['shard']} seq {r['seq']}"
        f" at {r.get('t', t0) - t0:.3f}s from {r.get('at')}"
        for r in records
        if r.get("id") == key.hex()
    )
    lines += _runs(records, shard, t0)
    lines += _numbers(records, shard)
    near = [(t, w) for t, w in sorted(timeline) if "Cleaner" not in w or abs(t - at) < 2]
    lines += ["timeline (the Cleaner's deletes within 2 s of the write):"]
    lines += _listed(f"  {t - t0:.3f}s {what}" for t, what in near)
    lines += _stored(store, key, shard)
    return "\n".join(lines)


def _around(acked: Sequence[Any], write: Any) -> list[Any]:
    """The acknowledged writes of ``write``'s key, from ten before it to three after."""
    mine = sorted((w for w in acked if w[0] == write[0]), key=lambda w: w[3])
    at = mine.index(write)
    return mine[max(0, at - 10) : at + 4]


def _listed(items: Any) -> list[str]:
    """At most ``_SHOWN`` lines, and how many were left out."""
    out = list(items)
    if len(out) <= _SHOWN:
        return out
    return [*out[: _SHOWN // 2], f"  ... {len(out) - _SHOWN} more ...", *out[-_SHOWN // 2 :]]


def _runs(records: Sequence[dict[str, Any]], shard: int, t0: float) -> list[str]:
    """Per consumer run, in order: its events of ``shard`` (how many, first and last
    sequence numbers and times, the servers read) and its acknowledgements of it."""
    runs: dict[int, dict[str, list[Any]]] = {}
    for r in records:
        its = runs.setdefault(r["run"], {"seq": [], "t": [], "at": [], "acks": []})
        if "ack" in r:
            position = r["ack"].get(str(shard))
            if position is not None and (not its["acks"] or its["acks"][-1][0] != position):
                its["acks"].append((position, r.get("t", t0) - t0))
        elif r["shard"] == shard:
            its["seq"].append(r["seq"])
            its["t"].append(r.get("t", t0) - t0)
            if r.get("at") not in its["at"]:
                its["at"].append(r.get("at"))
    lines = [f"consumer runs on shard {shard} (events: seq first..last, times; acks):"]
    for run, got in runs.items():
        seen = (
            f"{len(got['seq'])} events, seq {got['seq'][0]}..{got['seq'][-1]},"
            f" {got['t'][0]:.3f}s..{got['t'][-1]:.3f}s, from {got['at']}"
            if got["seq"]
            else "no events"
        )
        acks = ", ".join(f"{p} at {t:.3f}s" for p, t in got["acks"][-8:])
        lines.append(f"  run {run}: {seen}; {len(got['acks'])} acks, the last: {acks}")
    return lines


def _numbers(records: Sequence[dict[str, Any]], shard: int) -> list[str]:
    """``shard``'s sequence numbers delivered as two different changes, and those never
    delivered between the first and the last delivered."""
    changes: dict[int, set[tuple[str, int, bool]]] = {}
    for r in records:
        if "ack" not in r and r["shard"] == shard and r["seq"] is not None:
            changes.setdefault(int(r["seq"]), set()).add((r["id"], r["v"], r["del"]))
    twice = {seq: sorted(c) for seq, c in sorted(changes.items()) if len(c) > 1}
    holes = [n for n in range(min(changes, default=0), max(changes, default=0)) if n not in changes]
    return [
        f"seq numbers of shard {shard} delivered as different changes: {list(twice.items())[:10]}",
        f"seq numbers of shard {shard} never delivered (between the first and last): {holes[:20]}"
        + (f" and {len(holes) - 20} more" if len(holes) > 20 else ""),
    ]


def _stored(store: DataStore, key: bytes, shard: int) -> list[str]:
    """What each server holds now for the key and its shard (its errors as text)."""
    topo = store.cluster.refresh()
    owner = topo.servers[topo.shard_servers[shard]]
    lines = [f"map v{topo.map_version}: shard {shard} on {owner}; stored: {_got(store, key)}"]
    db = topo.owned_db
    if db is None:
        return lines
    reads = [
        f"SELECT `shard` FROM {quote(db, 'owned')} ORDER BY `shard`",
        f"SELECT `seq` FROM {quote(db, 'changes_head')} WHERE `shard` = {int(shard)}",
        f"SELECT `shard`, `added_id`, `version`, `body` IS NULL, `updated`"
        f" FROM {quote(db, 'entities')} WHERE `id` = %s",
        f"SELECT `shard`, `seq`, `version`, `body` IS NULL, `at` FROM {quote(db, 'changes')}"
        " WHERE `id` = %s ORDER BY `shard`, `seq`",
        f"SELECT COUNT(*), MIN(`seq`), MAX(`seq`) FROM {quote(db, 'changes')}"
        f" WHERE `shard` = {int(shard)}",
        f"SELECT COUNT(*), MAX(`added_id`) FROM {quote(db, 'entities')} WHERE `shard` = {shard}",
        "SELECT `AUTO_INCREMENT` FROM information_schema.tables"
        " WHERE `table_schema` = %s AND `table_name` = 'entities'",
    ]
    names = [
        "owned",
        "head",
        "entity rows",
        "change rows of the key",
        "changes of the shard (count, seqs)",
        "entities of the shard (count, last added_id)",
        "its next added_id",
    ]
    for sid, address in sorted(topo.servers.items()):
        try:
            sets = store.cluster.server(address).run(admin(reads), [key, key, db])
        except SchemalessError as exc:
            lines.append(f"server {sid} {address}: {exc}")
            continue
        held = "; ".join(f"{n} {[tuple(r) for r in s]}" for n, s in zip(names, sets, strict=True))
        lines.append(f"server {sid} {address}: {held}")
    return lines


def _got(store: DataStore, key: bytes) -> str:
    try:
        entity = store.get(key)
    except SchemalessError as exc:
        return str(exc)
    return "absent" if entity is None else f"v{entity.version}"
