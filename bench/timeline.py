"""``python -m bench.timeline``: "Implementing Timeline in Web Services" (Kazuho Oku, 2008).

The post measured two designs of a Twitter-like timeline on MySQL, with 10,000 users,
1,000,000 messages and 42.9 followers per user on average:

* **push**: on submit, the message id goes into every follower's mailbox; a timeline
  is one indexed read of the reader's mailbox (joined with the messages);
* **pull**: a message is written once; a timeline merges the newest messages of
  every followee at read time.

Both run twice on the same servers, in the same run: as the post's raw SQL (tables
``message`` and ``mailbox`` on the first server, one statement per followee for pull),
and built on schemaless:

* pull: messages are entities ``{id, user_id, body}``; index ``by_user_id`` on
  ``(user_id, id)`` sharded on ``user_id``.  A timeline is ``store.query(by_user_id,
  user_id__in=followees, order="desc", limit=20)``: each server gets ONE statement (a
  UNION ALL of one ``(... WHERE p_user_id = ? ORDER BY p_id DESC LIMIT n)`` per
  followee on that server, merged there by an outer ``ORDER BY ... LIMIT n``), then
  the 20 entities are fetched (one statement per server) and re-checked.  The same
  timeline as one ``query()`` per followee is measured too.
* push: messages carry their ``recipients`` (the author's followers); index
  ``mailbox`` on ``(recipients, id)``, multi-valued on ``recipients`` and sharded on
  it.  A timeline is one ``store.query("mailbox", recipients=me, order="desc")``.

A fifth model, the **push floor**, reads the schemaless push store's own tables with
the fewest statements they allow (the mailbox rows, then the bodies, one statement per
server) and no library: what any client of this layout pays.

The follow graph lives in the application's memory on both sides.  Data size is
``data_length + index_length`` from information_schema after ``ANALYZE TABLE``.

Example: ``python -m bench.timeline --scale 0.1`` (default), ``--scale 1`` for the
post's full size.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from schemaless import DataStore, Index
from schemaless.feeds import INBOX_COMPRESSED
from schemaless.hashing import shard_of
from schemaless.index import key_encode
from schemaless.names import quote
from schemaless.scatter import shard_is

from .data import WORDS, entity_id
from .env import RawClient, Servers, machine_info, set_server_globals, start_cluster
from .measure import run_interleaved, run_threads
from .provenance import load_average, provenance

__all__ = ["TimelineConfig", "run_timeline"]

PAGE = 20
BY_USER_ID = Index("by_user_id", {"user_id": "int", "id": "uuid"}, shard_on="user_id")
MAILBOX = Index(
    "mailbox", {"recipients": "int", "id": "uuid"}, shard_on="recipients", multi="recipients"
)
MODELS = ("raw push", "schemaless push", "raw pull", "schemaless pull")
FLOOR = "push floor (raw SQL, our tables)"


@dataclass
class TimelineConfig:
    scale: float = 0.1
    followees: float = 42.9
    shards: int = 16
    seconds: float = 2.0
    threads: int = 1
    prefix: str = "bench"
    cluster_dir: str = ".bench-cluster"
    durable: bool | None = True
    buffer_pool_mib: int = 1024
    keep: bool = False
    per_followee_api: bool = True  # also time pull through query() per followee


class Graph:
    """Users, who follows whom, and the messages (deterministic)."""

    def __init__(self, users: int, messages: int, followees: float, seed: int = 2008) -> None:
        self.users = users
        self.messages = messages
        rng = random.Random(seed)
        low = int(followees)
        frac = followees - low
        self.followees: list[list[int]] = []
        for u in range(users):
            k = min(users - 1, low + (1 if rng.random() < frac else 0))
            others = rng.sample(range(users - 1), k)
            self.followees.append([o if o < u else o + 1 for o in others])
        self.followers: list[list[int]] = [[] for _ in range(users)]
        for u, fs in enumerate(self.followees):
            for f in fs:
                self.followers[f].append(u)
        self.seed = seed

    def message(self, k: int) -> tuple[int, bytes, str]:
        """(author, schemaless id, body) of message ``k``; its raw id is ``k + 1``."""
        rng = random.Random(self.seed * 7_919 + k)
        author = rng.randrange(self.users)
        key = entity_id(k, rng)
        words: list[str] = []
        while sum(map(len, words)) + len(words) < 70:
            words.append(rng.choice(WORDS))
        return author, key, " ".join(words)[:90]


class Timeline:
    """The four implementations on one set of servers."""

    def __init__(self, servers: Servers, cfg: TimelineConfig, graph: Graph) -> None:
        self.servers = servers
        self.cfg = cfg
        self.g = graph
        self.raw = RawClient(servers)
        self.db_pull = f"{cfg.prefix}_tl_rawpull"
        self.db_push = f"{cfg.prefix}_tl_rawpush"
        common: dict[str, Any] = {
            "shards": cfg.shards,
            "option_file": servers.option_file,
            "pool_size": 32,
        }
        self.pull = DataStore(
            list(servers.addresses), [BY_USER_ID], prefix=f"{cfg.prefix}_tl_pull", **common
        )
        self.push = DataStore(
            list(servers.addresses), [MAILBOX], prefix=f"{cfg.prefix}_tl_push", **common
        )
        self.next_message = itertools.count(graph.messages)
        topo = self.push.cluster.refresh()
        # the push store's map, and the raw client's server of each logical shard
        self.push_layout = (topo, _positions(self.push, servers.addresses))

    def close(self) -> None:
        self.pull.close()
        self.push.close()
        self.raw.close()

    # -- schema and loading ---------------------------------------------------------------

    def create_raw(self) -> None:
        msg = (
            "CREATE TABLE IF NOT EXISTS {db}.`message` ("
            " `id` INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,"
            " `user_id` INT UNSIGNED NOT NULL, `body` VARCHAR(255) NOT NULL,"
            " KEY `user_id_id` (`user_id`, `id`)) ENGINE=InnoDB"
        )
        self.raw.run(
            0,
            f"CREATE DATABASE IF NOT EXISTS {quote(self.db_pull)};"
            f"CREATE DATABASE IF NOT EXISTS {quote(self.db_push)};"
            + msg.format(db=quote(self.db_pull))
            + ";"
            + msg.format(db=quote(self.db_push))
            + f";CREATE TABLE IF NOT EXISTS {quote(self.db_push, 'mailbox')} ("
            " `user_id` INT UNSIGNED NOT NULL, `message_id` INT UNSIGNED NOT NULL,"
            " PRIMARY KEY (`user_id`, `message_id`)) ENGINE=InnoDB",
        )

    def load(self, batch: int = 500) -> dict[str, float]:
        """All messages into the four models; seconds per model."""
        out = {}
        n = self.g.messages
        chunks = [(a, min(n, a + batch)) for a in range(0, n, batch)]

        def raw_pull(a: int, b: int) -> None:
            rows = [self.g.message(k) for k in range(a, b)]
            params: list[Any] = []
            for k, (author, _, body) in zip(range(a, b), rows, strict=True):
                params += [k + 1, author, body]
            values = ", ".join(["(%s, %s, %s)"] * len(rows))
            self.raw.run(
                0,
                f"INSERT INTO {quote(self.db_pull, 'message')} (`id`, `user_id`, `body`)"
                f" VALUES {values}",
                params,
            )

        def raw_push(a: int, b: int) -> None:
            params: list[Any] = []
            box: list[int] = []
            for k in range(a, b):
                author, _, body = self.g.message(k)
                params += [k + 1, author, body]
                for f in self.g.followers[author]:
                    box += [f, k + 1]
            values = ", ".join(["(%s, %s, %s)"] * (b - a))
            sql = (
                f"START TRANSACTION; INSERT INTO {quote(self.db_push, 'message')}"
                f" (`id`, `user_id`, `body`) VALUES {values}"
            )
            if box:
                sql += (
                    f"; INSERT INTO {quote(self.db_push, 'mailbox')} (`user_id`, `message_id`)"
                    f" VALUES {', '.join(['(%s, %s)'] * (len(box) // 2))}"
                )
            self.raw.run(0, sql + "; COMMIT", params + box)

        def sl_pull(a: int, b: int) -> None:
            self.pull.put_many([self.pull_entity(k) for k in range(a, b)])

        def sl_push(a: int, b: int) -> None:
            self.push.put_many([self.push_entity(k) for k in range(a, b)])

        for name, fn, size in (
            ("raw pull", raw_pull, 2000),
            ("raw push", raw_push, 200),
            ("schemaless pull", sl_pull, batch),
            ("schemaless push", sl_push, 100),
        ):
            t0 = time.perf_counter()
            parts = [(a, min(n, a + size)) for a in range(0, n, size)] if size != batch else chunks
            _parallel(_star(fn), parts, 2)
            out[name] = round(time.perf_counter() - t0, 2)
            _log(f"  loaded {name}: {out[name]} s")
        return out

    def pull_entity(self, k: int) -> dict[str, Any]:
        author, key, body = self.g.message(k)
        return {"id": key, "user_id": author, "body": body}

    def push_entity(self, k: int) -> dict[str, Any]:
        author, key, body = self.g.message(k)
        return {"id": key, "user_id": author, "body": body, "recipients": self.g.followers[author]}

    def sizes(self) -> dict[str, float]:
        """MB (data + indexes) of each model, after ANALYZE TABLE."""
        out: dict[str, float] = {}
        for name, dbs in (
            ("raw pull", {0: [self.db_pull]}),
            ("raw push", {0: [self.db_push]}),
            ("schemaless pull", _shard_dbs(self.pull, self.servers.addresses)),
            ("schemaless push", _shard_dbs(self.push, self.servers.addresses)),
        ):
            total = 0
            for sid, names in dbs.items():
                tables = self.servers.admin(
                    sid,
                    "SELECT table_schema, table_name FROM information_schema.tables"
                    f" WHERE table_schema IN ({', '.join(['%s'] * len(names))})",
                    names,
                )
                if tables:
                    stmt = ", ".join(quote(s, t) for s, t in tables)
                    self.servers.admin(sid, f"ANALYZE TABLE {stmt}")
                rows = self.servers.admin(
                    sid,
                    "SELECT COALESCE(SUM(data_length + index_length), 0)"
                    " FROM information_schema.tables"
                    f" WHERE table_schema IN ({', '.join(['%s'] * len(names))})",
                    names,
                )
                total += int(rows[0][0])
            out[name] = round(total / 1e6, 1)
        return out

    # -- submissions ----------------------------------------------------------------------

    def submit_raw_pull(self, k: int) -> None:
        author, _, body = self.g.message(k)
        self.raw.run(
            0,
            f"INSERT INTO {quote(self.db_pull, 'message')} (`user_id`, `body`) VALUES (%s, %s)",
            (author, body),
        )

    def submit_raw_push(self, k: int) -> None:
        author, _, body = self.g.message(k)
        fs = self.g.followers[author]
        sql = (
            f"START TRANSACTION; INSERT INTO {quote(self.db_push, 'message')}"
            " (`user_id`, `body`) VALUES (%s, %s)"
        )
        if fs:
            sql += (
                f"; INSERT INTO {quote(self.db_push, 'mailbox')} (`user_id`, `message_id`)"
                f" VALUES {', '.join(['(%s, LAST_INSERT_ID())'] * len(fs))}"
            )
        self.raw.run(0, sql + "; COMMIT", [author, body, *fs])

    # -- timelines ------------------------------------------------------------------------

    def raw_pull_timeline(self, user: int, before: int | None) -> list[tuple[Any, ...]]:
        """The post's pull: the newest messages of each followee, one query each."""
        cond = "" if before is None else " AND `id` < %s"
        sql = (
            f"SELECT `id`, `user_id`, `body` FROM {quote(self.db_pull, 'message')}"
            f" WHERE `user_id` = %s{cond} ORDER BY `id` DESC LIMIT {PAGE}"
        )
        rows: list[tuple[Any, ...]] = []
        for f in self.g.followees[user]:
            rows += self.raw.run(0, sql, (f,) if before is None else (f, before))[0]
        rows.sort(reverse=True)
        return rows[:PAGE]

    def raw_push_timeline(self, user: int, before: int | None) -> list[tuple[Any, ...]]:
        cond = "" if before is None else " AND b.`message_id` < %s"
        sql = (
            f"SELECT m.`id`, m.`user_id`, m.`body` FROM {quote(self.db_push, 'mailbox')} b"
            f" JOIN {quote(self.db_push, 'message')} m ON m.`id` = b.`message_id`"
            f" WHERE b.`user_id` = %s{cond} ORDER BY b.`message_id` DESC LIMIT {PAGE}"
        )
        return list(self.raw.run(0, sql, (user,) if before is None else (user, before))[0])

    def sl_push_timeline(self, user: int, before: bytes | None) -> list[Any]:
        if before is None:
            return self.push.query(MAILBOX, recipients=user, order="desc", limit=PAGE)
        return self.push.query(MAILBOX, recipients=user, id__lt=before, order="desc", limit=PAGE)

    def floor_push_timeline(self, user: int, before: bytes | None) -> list[Any]:
        """The push store's timeline as the fewest statements its tables allow: the
        mailbox rows, then the bodies (one statement per server), decoded; no re-check,
        no library.  What any client of this layout pays, however fast."""
        topo, servers = self.push_layout
        n = len(servers)
        shard = shard_of(key_encode(user), n)
        cond = "" if before is None else " AND `p_id` < %s"
        rows = self.raw.run(
            servers[shard],
            f"SELECT `entity_id` FROM {quote(topo.dbs[shard], MAILBOX.table)}"
            f" WHERE {shard_is(topo, shard)}`p_recipients` = %s{cond}"
            f" ORDER BY `p_id` DESC LIMIT {PAGE}",
            (user,) if before is None else (user, before),
        )[0]
        keys = [bytes(r[0]) for r in rows]
        by_db: dict[tuple[int, str], list[bytes]] = {}  # owned layout: one per server
        for key in keys:
            s = shard_of(key, n)
            by_db.setdefault((servers[s], topo.dbs[s]), []).append(key)
        parts: dict[int, tuple[list[str], list[bytes]]] = {}
        for (sid, db), ks in by_db.items():
            sql, params = parts.setdefault(sid, ([], []))
            sql.append(
                f"SELECT `id`, `body` FROM {quote(db, 'entities')}"
                f" WHERE `id` IN ({', '.join(['%s'] * len(ks))})"
            )
            params += ks
        calls = {sid: (" UNION ALL ".join(sql), params) for sid, (sql, params) in parts.items()}
        decode = self.push.codec.decode
        bodies = {k: decode(b) for res in self.raw.fanout(calls).values() for k, b in res[0]}
        return [bodies[k] for k in keys]

    def sl_pull_timeline(self, user: int, before: bytes | None) -> list[Any]:
        """One statement per server over all followees there (``user_id__in``)."""
        followees = self.g.followees[user]
        if not followees:
            return []
        if before is None:
            return self.pull.query(BY_USER_ID, user_id__in=followees, order="desc", limit=PAGE)
        return self.pull.query(
            BY_USER_ID, user_id__in=followees, id__lt=before, order="desc", limit=PAGE
        )

    def sl_pull_timeline_per_followee(self, user: int, before: bytes | None) -> list[Any]:
        """The same through the public API: one query() per followee."""
        rows: list[Any] = []
        for f in self.g.followees[user]:
            if before is None:
                page = self.pull.query(BY_USER_ID, user_id=f, order="desc", limit=PAGE)
            else:
                page = self.pull.query(
                    BY_USER_ID, user_id=f, id__lt=before, order="desc", limit=PAGE
                )
            rows += page
        rows.sort(key=lambda e: e["id"], reverse=True)
        return rows[:PAGE]


def _positions(store: DataStore, addresses: Sequence[str]) -> list[int]:
    """The position in ``addresses`` of each logical shard's server."""
    topo = store.cluster.refresh()
    position = {addr: i for i, addr in enumerate(addresses)}
    return [position[str(topo.servers[sid])] for sid in topo.shard_servers]


def _shard_dbs(store: DataStore, addresses: Sequence[str]) -> dict[int, list[str]]:
    """The databases of the store's logical shards (the data database once per server
    in the owned layout), by position in ``addresses``."""
    dbs = store.cluster.refresh().dbs
    out: dict[int, list[str]] = {}
    for shard, pos in enumerate(_positions(store, addresses)):
        names = out.setdefault(pos, [])
        if dbs[shard] not in names:
            names.append(dbs[shard])
    return out


def _star(fn: Callable[..., Any]) -> Callable[[tuple[Any, ...]], Any]:
    return lambda args: fn(*args)


def _with(fn: Callable[[Any, Any], Any], second: Any) -> Callable[[Any], Any]:
    return lambda first: fn(first, second)


def _parallel(fn: Callable[[Any], None], items: list[Any], threads: int) -> None:
    from .ops import _parallel as parallel

    parallel(fn, items, threads)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _rates(
    fns: dict[str, Callable[[Any], object]], items: list[Any], threads: int, seconds: float
) -> dict[str, dict[str, float]]:
    """Each model for ``seconds`` in all, interleaved with the others (two rounds)."""
    calls = {name: (fn, itertools.cycle(items)) for name, fn in fns.items()}
    out = {}
    for name, sample in run_interleaved(calls, threads, seconds, rounds=2).items():
        s = sample.summary()
        out[name] = {"per_s": s["throughput"], "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"]}
    return out


def run_timeline(cfg: TimelineConfig, servers: Servers | None = None) -> dict[str, Any]:
    """Build, load and measure the five models; the results."""
    from .harness import drop_prefix

    started = time.time()
    if servers is None:
        servers = start_cluster(cfg.cluster_dir, 2, durable=cfg.durable is not False)
    set_server_globals(servers, cfg.durable, cfg.buffer_pool_mib)
    drop_prefix(servers, cfg.prefix)
    users = max(2, round(10_000 * cfg.scale))
    messages = max(10, round(1_000_000 * cfg.scale))
    graph = Graph(users, messages, cfg.followees)
    _log(f"timeline: {users} users, {messages} messages, {cfg.followees} followees per user")
    tl = Timeline(servers, cfg, graph)
    results: dict[str, Any] = {
        "meta": {
            "started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
            "config": asdict(cfg),
            "machine": machine_info(servers),
            "users": users,
            "messages": messages,
            "followers_mean": round(sum(map(len, graph.followers)) / users, 2),
        }
    }
    try:
        tl.create_raw()
        results["load_s"] = tl.load()
        results["size_mb"] = tl.sizes()
        rng = random.Random(5)
        readers = [rng.randrange(users) for _ in range(2000)]
        mid = messages // 2
        cut_raw, cut_sl = mid + 1, graph.message(mid)[1]
        # sanity: the five models return the same timeline
        for u in readers[:5]:
            a = [r[0] for r in tl.raw_push_timeline(u, None)]
            b = [r[0] for r in tl.raw_pull_timeline(u, None)]
            c = [e["id"] for e in tl.sl_push_timeline(u, None)]
            d = [e["id"] for e in tl.sl_pull_timeline(u, None)]
            assert a == b, "raw push and raw pull disagree"
            assert c == d, "schemaless push and pull disagree"
            assert [graph.message(i - 1)[1] for i in a] == c, "raw and schemaless disagree"
            for cut in (None, cut_sl):
                want = [e["id"] for e in tl.sl_push_timeline(u, cut)]
                assert [e["id"] for e in tl.floor_push_timeline(u, cut)] == want, "floor"
        timelines: dict[str, Callable[[Any, Any], Any]] = {
            "raw push": tl.raw_push_timeline,
            "schemaless push": tl.sl_push_timeline,
            "raw pull": tl.raw_pull_timeline,
            "schemaless pull": tl.sl_pull_timeline,
            FLOOR: tl.floor_push_timeline,
        }
        rows: dict[str, dict[str, Any]] = {name: {} for name in timelines}
        for page in ("first", "older"):
            fns = {}
            for name, fn in timelines.items():
                cut = cut_raw if name.startswith("raw") else cut_sl
                fns[name] = _with(fn, cut if page == "older" else None)
            for name, rates in _rates(fns, readers, cfg.threads, cfg.seconds).items():
                rows[name][f"timelines_{page}"] = rates
        if cfg.per_followee_api:  # a diagnostic: measured alone, briefly
            name = "schemaless pull, query() per followee"
            fn = tl.sl_pull_timeline_per_followee
            for page, before in (("first", None), ("older", cut_sl)):
                alone = _rates({name: _with(fn, before)}, readers, cfg.threads, cfg.seconds / 4)
                rows.setdefault(name, {})[f"timelines_{page}"] = alone[name]
        for name, row in rows.items():
            first, older = row["timelines_first"]["per_s"], row["timelines_older"]["per_s"]
            _log(f"  {name}: {first:.0f} timelines/s, older {older:.0f}/s")
        submit: dict[str, Callable[[int], object]] = {
            "raw push": tl.submit_raw_push,
            "schemaless push": lambda k: tl.push.put(tl.push_entity(k)),
            "raw pull": tl.submit_raw_pull,
            "schemaless pull": lambda k: tl.pull.put(tl.pull_entity(k)),
        }
        for name, sub in submit.items():
            ks = [next(tl.next_message) for _ in range(20000)]
            s = run_threads(sub, iter(ks), cfg.threads, cfg.seconds).summary()
            rows[name]["submissions"] = {
                "per_s": s["throughput"],
                "p50_ms": s["p50_ms"],
                "p99_ms": s["p99_ms"],
            }
            _log(f"  {name}: {s['throughput']:.0f} submissions/s")
        results["models"] = rows
        results["goals"] = {
            f"{model}_{page}_vs_raw": round(
                rows[f"schemaless {model}"][f"timelines_{key}"]["per_s"]
                / rows[f"raw {model}"][f"timelines_{key}"]["per_s"],
                2,
            )
            for model in ("pull", "push")
            for page, key in (("retrieval", "first"), ("older", "older"))
        }
        for page, key in (("retrieval", "first"), ("older", "older")):
            results["goals"][f"push_floor_{page}_vs_raw"] = round(
                rows[FLOOR][f"timelines_{key}"]["per_s"]
                / rows["raw push"][f"timelines_{key}"]["per_s"],
                2,
            )
        results["meta"]["seconds"] = round(time.time() - started, 1)
    finally:
        tl.close()
        if not cfg.keep:
            drop_prefix(servers, cfg.prefix)
    return results


def format_timeline(results: dict[str, Any]) -> str:
    m = results["meta"]
    mach = m["machine"]
    lines = [
        f"timeline: {m['users']} users, {m['messages']} messages, "
        f"{m['followers_mean']} followers per user; {mach['servers']} servers, MariaDB "
        f"{mach['mariadb']}, {'durable' if mach['durable'] else 'NOT durable'}, "
        f"{mach['nproc']} cores; {m['config']['threads']} client thread(s)",
        f"{'model':<40} {'size MB':>8} {'submit/s':>9} {'timelines/s':>12} {'older/s':>8}"
        f" {'p50 ms':>7}",
    ]
    lines.append("-" * len(lines[-1]))
    for name, row in results["models"].items():
        size = results["size_mb"].get(name)
        sub = row.get("submissions", {}).get("per_s")
        lines.append(
            f"{name:<40} {size if size is not None else '':>8} "
            f"{sub if sub is not None else '':>9} "
            f"{row['timelines_first']['per_s']:>12.0f} {row['timelines_older']['per_s']:>8.0f}"
            f" {row['timelines_first']['p50_ms']:>7.2f}"
        )
    g = results["goals"]
    lines.append("")
    lines.append(
        f"schemaless pull / raw pull retrieval: {g['pull_retrieval_vs_raw']}x first page, "
        f"{g['pull_older_vs_raw']}x older page (goal >= 3x, aim 5x)"
    )
    lines.append(
        f"schemaless push / raw push retrieval: {g['push_retrieval_vs_raw']}x first page, "
        f"{g['push_older_vs_raw']}x older page (goal >= 0.5x); the layout's floor (raw SQL"
        f" on the same tables): {g['push_floor_retrieval_vs_raw']}x and "
        f"{g['push_floor_older_vs_raw']}x"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.timeline",
        description="Timeline push/pull, raw SQL vs schemaless (example: --scale 0.1)",
    )
    p.add_argument("--scale", type=float, default=0.1, help="1 = 10,000 users, 1M messages")
    p.add_argument("--followees", type=float, default=42.9)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dir", default=".bench-cluster")
    p.add_argument("--prefix", default="bench")
    p.add_argument("--no-durable", action="store_true")
    p.add_argument("--buffer-pool-mb", type=int, default=1024)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    cfg = TimelineConfig(
        scale=a.scale,
        followees=a.followees,
        shards=a.shards,
        seconds=a.seconds,
        threads=a.threads,
        prefix=a.prefix,
        cluster_dir=a.dir,
        durable=not a.no_durable,
        buffer_pool_mib=a.buffer_pool_mb,
        keep=a.keep,
    )
    results = run_timeline(cfg)
    print(format_timeline(results))
    from .harness import write_results

    for path in write_results(results, a.out, "timeline-"):
        print(f"results: {path}")


if __name__ == "__main__":
    main()


# -- fan-out and Oku's table with the library (issue 41) ------------------------------


def _feeds_store(servers: Servers, prefix: str, threads: int) -> DataStore:
    """A datastore for the library's feeds: 16 logical shards, the change feed on, a
    pool for ``threads`` readers and the fan-out worker."""
    return DataStore(
        list(servers.addresses),
        prefix=prefix,
        shards=16,
        changes=True,
        option_file=servers.option_file,
        pool_size=threads + 8,
    )


def fanout(servers: Servers, prefix: str, followers: int, threads: int = 8) -> dict[str, Any]:
    """One post to ``followers`` followers: seconds from its acknowledgement until the
    worker (running, polling every 10 ms) has fanned it out and every follower's
    ``home()`` shows it; then the p99 of posts with fan-outs running against posts with
    none (``_post_latencies``)."""
    from concurrent.futures import ThreadPoolExecutor

    from schemaless import Feeds, new_id

    ds = _feeds_store(servers, f"{prefix}_tl_fan", threads)
    try:
        feeds = Feeds(ds, "home", pull_threshold=followers + 1, backfill=0)
        star, fans = new_id(), [new_id() for _ in range(followers)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda f: feeds.follow(f, star), fans))
        follow_s = time.perf_counter() - t0
        feeds.work(once=True)
        stop = [False]

        def work() -> None:
            while not stop[0]:
                feeds.work(once=True, poll=0.01)
                time.sleep(0.01)

        import threading

        worker = threading.Thread(target=work)
        worker.start()
        try:
            t0 = time.perf_counter()
            feeds.post(star, {"text": "to everyone"})
            acked = time.perf_counter()
            assert feeds.settle(timeout=60)
            fanned = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                seen = list(pool.map(lambda f: len(feeds.home(f, limit=1)), fans))
            visible = time.perf_counter()
            latency = _post_latencies(feeds, star)
        finally:
            stop[0] = True
            worker.join()
        return {
            "followers": followers,
            "follow_s": round(follow_s, 2),
            "post_ms": round((acked - t0) * 1000, 2),
            "fanned_out_s": round(fanned - acked, 3),
            "all_homes_read_s": round(visible - fanned, 3),
            "all_visible": all(seen),
            **{
                f"{k}_p99_ms": round(1000 * sorted(v)[len(v) * 99 // 100 - 1], 2)
                for k, v in latency.items()
            },
        }
    finally:
        ds.close()


def _post_latencies(feeds: Any, star: bytes, rounds: int = 100) -> dict[str, list[float]]:
    """Post latencies, the worker running, interleaved round by round so the load
    weighs alike: an author without followers with nothing fanned out (``quiet``),
    then the star's post (its fan-out starts), then, while that fan-out runs, the
    star's next post and the loner's (``star_during_fan_out``, ``loner_during_fan_out``)."""
    from schemaless import new_id

    loner = new_id()
    out: dict[str, list[float]] = {
        "quiet": [],
        "star": [],
        "star_during_fan_out": [],
        "loner_during_fan_out": [],
    }
    for _ in range(rounds):
        assert feeds.settle(timeout=60)
        for author, key in ((loner, "quiet"), (star, "star")):
            t0 = time.perf_counter()
            feeds.post(author, {"text": "to everyone"})
            out[key].append(time.perf_counter() - t0)
        time.sleep(0.02)  # the worker polls every 10 ms: its fan-out is under way
        for author, key in ((star, "star_during_fan_out"), (loner, "loner_during_fan_out")):
            t0 = time.perf_counter()
            feeds.post(author, {"text": "to everyone"})
            out[key].append(time.perf_counter() - t0)
    return out


def fanout_main(argv: Sequence[str] | None = None) -> None:
    """``python -c 'from bench.timeline import fanout_main; fanout_main()'``."""
    from .harness import drop_prefix

    p = argparse.ArgumentParser(prog="fan-out")
    p.add_argument("--followers", type=int, default=10_000)
    p.add_argument("--dir", default=".bench-cluster")
    p.add_argument("--prefix", default="bench")
    a = p.parse_args(argv)
    servers = start_cluster(a.dir, 2, durable=True)
    drop_prefix(servers, a.prefix)
    try:
        print(fanout(servers, a.prefix, a.followers))
    finally:
        drop_prefix(servers, a.prefix)


Read = tuple[Callable[[Any], object], Any]  # a model's home() and its readers


def feeds_table(
    servers: Servers,
    prefix: str,
    scale: float,
    threads: int = 8,
    seconds: float = 6.0,
    rounds: int = 3,
) -> dict[str, dict[str, float]]:
    """Oku's table with the library (``schemaless.feeds``): push (no author pulled),
    pull (every author pulled) and the hybrid (authors above the 99th percentile of
    followers pulled), and the post's raw push and pull, on the same graph and
    messages: load seconds (follows, posts, fan-out) and MB of each, then first pages
    of 20 read by one thread from every model in alternating slices (``rounds`` of
    each, ``seconds`` in all per model), so background load weighs on all alike."""
    users = max(2, round(10_000 * scale))
    graph = Graph(users, max(10, round(1_000_000 * scale)), 42.9)
    top = sorted(map(len, graph.followers))[users * 99 // 100]
    readers = random.Random(5).sample(range(users), min(users, 500))
    out: dict[str, dict[str, float]] = {}
    reads: dict[str, Read] = {}
    stores: list[DataStore] = []
    tl = Timeline(servers, TimelineConfig(prefix=prefix), graph)
    try:
        for model, threshold in (("push", 10**9), ("pull", 0), ("hybrid", top)):
            ds = _feeds_store(servers, f"{prefix}_tl_feeds_{model}", threads)
            stores.append(ds)
            out[model], reads[model] = _feeds_model(ds, graph, threshold, threads, readers)
            _log(f"  feeds {model} (pulled above {threshold} followers): {out[model]}")
        for model, (row, read) in _raw_models(tl, servers, threads, readers).items():
            out[model], reads[model] = row, read
        for model, sample in run_interleaved(reads, 1, seconds, rounds).items():
            s = sample.summary()
            out[model]["timelines_per_s"], out[model]["p50_ms"] = s["throughput"], s["p50_ms"]
    finally:
        for ds in stores:
            ds.close()
        tl.close()
    return out


def _raw_models(
    tl: Timeline, servers: Servers, threads: int, readers: list[int]
) -> dict[str, tuple[dict[str, float], Read]]:
    """The post's raw push and pull (its SQL on the first server), loaded: load
    seconds, MB and the reads."""
    from concurrent.futures import ThreadPoolExecutor

    out: dict[str, tuple[dict[str, float], Read]] = {}
    tl.create_raw()
    for model, submit, read, db in (
        ("raw push", tl.submit_raw_push, tl.raw_push_timeline, tl.db_push),
        ("raw pull", tl.submit_raw_pull, tl.raw_pull_timeline, tl.db_pull),
    ):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(submit, range(tl.g.messages)))
        row = {"posts_s": round(time.perf_counter() - t0, 1)}
        servers.admin(
            0,
            f"ANALYZE TABLE `{db}`.`message`" + (f", `{db}`.`mailbox`" if "push" in model else ""),
        )
        size = servers.admin(
            0,
            "SELECT SUM(data_length + index_length) FROM information_schema.tables"
            " WHERE table_schema = %s",
            (db,),
        )[0][0]
        row["size_mb"] = round(int(size) / 1e6, 1)
        out[model] = row, (_with(read, None), itertools.cycle(readers))
        _log(f"  {model}: {row}")
    return out


def _feeds_model(
    ds: DataStore, graph: Graph, threshold: int, threads: int, readers: list[int]
) -> tuple[dict[str, float], Read]:
    """One model loaded through the library: load seconds, MB and its reads."""
    from concurrent.futures import ThreadPoolExecutor

    from schemaless import Feeds

    ids = [entity_id(10**9 + u, random.Random(u)) for u in range(graph.users)]
    feeds = Feeds(ds, "home", pull_threshold=threshold, backfill=0)
    row: dict[str, float] = {}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        pairs = [(ids[u], ids[f]) for u, fs in enumerate(graph.followees) for f in fs]
        list(pool.map(lambda p: feeds.follow(*p), pairs))
        row["follows_s"] = round(time.perf_counter() - t0, 1)
        _log(f"    {row}")
        t0 = time.perf_counter()
        messages = map(graph.message, range(graph.messages))
        list(pool.map(lambda m: feeds.post(ids[m[0]], {"body": m[2]}), messages))
    row["posts_s"] = round(time.perf_counter() - t0, 1)
    _log(f"    {row}")
    t0 = time.perf_counter()
    feeds.work(once=True)
    row["fan_out_s"] = round(time.perf_counter() - t0, 1)
    _log(f"    {row}")
    row["size_mb"] = round(_data_bytes(ds) / 1e6, 1)
    return row, (feeds.home, itertools.cycle([ids[u] for u in readers]))


def _data_bytes(ds: DataStore) -> int:
    """``data_length + index_length`` of the data database on every server, after
    ``ANALYZE TABLE``."""
    db = ds.cluster.current().owned_db
    total = 0
    for server in ds.cluster.servers():
        names = "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
        tables = ", ".join(f"`{db}`.`{t}`" for (t,) in server.run(names, (db,))[0])
        server.run(f"/*schemaless:admin*/ ANALYZE TABLE {tables}")
        rows = server.run(
            "SELECT COALESCE(SUM(data_length + index_length), 0)"
            " FROM information_schema.tables WHERE table_schema = %s",
            (db,),
        )
        total += int(rows[0][0][0])
    return total


#: The floor of an inbox row: what InnoDB costs for each layout, on the same rows
#: (columns, table options).
_INBOX = (
    "`shard` SMALLINT UNSIGNED NOT NULL, `user` BINARY(16) NOT NULL,"
    " `at` BIGINT UNSIGNED NOT NULL, `post` BINARY(16) NOT NULL,"
    " `author` BINARY(16) NOT NULL, PRIMARY KEY (`shard`, `user`, `at`, `post`)"
)
INBOX_LAYOUTS = {
    "raw mailbox (INT user, INT message)": (
        "`user` INT UNSIGNED NOT NULL, `post` INT UNSIGNED NOT NULL, PRIMARY KEY (`user`, `post`)",
        "",
    ),
    "floor (BINARY(16) user, BIGINT time, BINARY(16) post)": (
        "`user` BINARY(16) NOT NULL, `at` BIGINT UNSIGNED NOT NULL,"
        " `post` BINARY(16) NOT NULL, PRIMARY KEY (`user`, `at`, `post`)",
        "",
    ),
    "inbox uncompressed (floor + shard, author)": (_INBOX, ""),
    "inbox with a second key (user, post), as before": (
        _INBOX + ", UNIQUE KEY `once` (`shard`, `user`, `post`)",
        "",
    ),
    "inbox now (compressed pages)": (_INBOX, INBOX_COMPRESSED),
}


def inbox_floor(
    servers: Servers, prefix: str, users: int = 1000, messages: int = 5000
) -> dict[str, float]:
    """Bytes per row (``data_length + index_length`` after ``ANALYZE``) of each
    ``INBOX_LAYOUTS`` table holding the same mailbox rows of a ``Graph``, inserted in
    fan-out order (message after message, its followers' rows)."""
    graph = Graph(users, messages, 42.9)
    ids = [entity_id(10**9 + u, random.Random(u)) for u in range(users)]
    posts = [graph.message(k)[:2] for k in range(messages)]  # (author, id)
    mailbox = [(f, k) for k, (author, _) in enumerate(posts) for f in graph.followers[author]]
    shapes: list[Callable[[int, int], tuple[Any, ...]]] = [
        lambda f, k: (f, k + 1),
        lambda f, k: (ids[f], k + 1, posts[k][1]),
        *[lambda f, k: (0, ids[f], k + 1, posts[k][1], ids[posts[k][0]])] * 3,
    ]
    db = f"{prefix}_tl_floor"
    servers.admin(0, f"CREATE DATABASE IF NOT EXISTS `{db}`")
    out: dict[str, float] = {}
    for n, ((name, (columns, options)), shape) in enumerate(
        zip(INBOX_LAYOUTS.items(), shapes, strict=True)
    ):
        table = f"`{db}`.`t{n}`"
        servers.admin(0, f"CREATE TABLE {table} ({columns}) ENGINE=InnoDB {options}")
        for start in range(0, len(mailbox), 2000):
            values = [shape(f, k) for f, k in mailbox[start : start + 2000]]
            marks = "(" + ", ".join(["%s"] * len(values[0])) + ")"
            flat = [v for row in values for v in row]
            servers.admin(0, f"INSERT INTO {table} VALUES {', '.join([marks] * len(values))}", flat)
        servers.admin(0, f"ANALYZE TABLE {table}")
        size = servers.admin(
            0,
            "SELECT data_length + index_length FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name = %s",
            (db, f"t{n}"),
        )[0][0]
        out[name] = round(int(size) / len(mailbox), 1)
    return out


def floor_main(argv: Sequence[str] | None = None) -> None:
    """``python -c 'from bench.timeline import floor_main; floor_main()'``: bytes per
    inbox row of each layout (``inbox_floor``)."""
    from .harness import drop_prefix

    p = argparse.ArgumentParser(prog="inbox floor")
    p.add_argument("--users", type=int, default=1000)
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--dir", default=".bench-cluster")
    p.add_argument("--prefix", default="bench")
    a = p.parse_args(argv)
    servers = start_cluster(a.dir, 2, durable=True)
    drop_prefix(servers, a.prefix)
    try:
        for name, per_row in inbox_floor(servers, a.prefix, a.users, a.messages).items():
            print(f"{name}: {per_row} bytes a row")
    finally:
        drop_prefix(servers, a.prefix)


def feeds_main(argv: Sequence[str] | None = None) -> None:
    """``python -c 'from bench.timeline import feeds_main; feeds_main()'`` (--scale)."""
    from .harness import drop_prefix

    p = argparse.ArgumentParser(prog="feeds table")
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--seconds", type=float, default=6.0, help="of reads per model")
    p.add_argument("--dir", default=".bench-cluster")
    p.add_argument("--prefix", default="bench")
    p.add_argument("--buffer-pool-mb", type=int, default=1024, help="each server's, this run")
    p.add_argument("--redo-log-mb", type=int, default=0, help="each server's (0: leave it)")
    a = p.parse_args(argv)
    servers = start_cluster(a.dir, 2, durable=True)
    set_server_globals(servers, True, a.buffer_pool_mb, a.redo_log_mb)
    drop_prefix(servers, a.prefix)
    before = load_average()
    try:
        rows = feeds_table(servers, a.prefix, a.scale, a.threads, a.seconds)
        print(f"{provenance(argv)}; load average before {before}, after {load_average()}")
        for model, row in rows.items():
            print(model, row)
        for model in ("push", "pull"):
            ratio = rows[model]["timelines_per_s"] / rows[f"raw {model}"]["timelines_per_s"]
            print(f"{model}: home() {ratio:.2f}x raw {model}'s timelines/s", end="")
            print(f", storage {rows[model]['size_mb'] / rows[f'raw {model}']['size_mb']:.1f}x")
    finally:
        drop_prefix(servers, a.prefix)
