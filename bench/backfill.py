"""Backfill of a new index: the Cleaner against MariaDB's own ``ALTER TABLE ADD INDEX``.

With the dataset loaded, in the same run:

* **MariaDB**: the same entities as JSON documents, then ``ALTER TABLE docs ADD COLUMN
  v BIGINT AS (JSON_VALUE(doc, '$.updated')) VIRTUAL, ADD INDEX (v)``, twice: on one
  table holding every document (one server, as the issue's reference figure), and on
  one table per server holding that server's share, both servers in parallel (the
  same hardware the Cleaner uses).
* **naive loop** (a reference, written here): one thread scans every logical shard by
  ``added_id`` (1000 rows a batch), decodes, and inserts the index rows with one
  multi-row INSERT per target shard into tables of the index's shape.
* **insert floor** (a reference): only the inserts, every statement's text (literals
  included) built before the clock starts, 2000 rows a transaction, both servers in
  parallel: what the servers need to add the rows one by one, however fast the client.
* **the Cleaner** (``schemaless.cleaner``), once the servers have settled (under a
  tenth of a core over a second, at most 60 s: the references' writes leave InnoDB
  purging and flushing): a new index on ``updated`` is declared
  (``building``); after the grace period ``cleaner --index=NAME --jobs N`` runs it to
  ``ready``, as a service manager runs it (in a session of its own, as the servers
  run), while a writer thread in this process puts new entities the whole time.
  Three runs, each on an index of its own (the same definition): the default throttle
  with ``--jobs 1``, the Cleaner's default (``--throttled-jobs``; its progress lines,
  with the throttle's limit and reason, are kept), then ``--no-throttle`` with ``--jobs
  N`` (``--cleaner-jobs``, default 2) and with ``--jobs 1``; the throttled run's speed is
  against the unthrottled one with as many processes.  Where the Cleaner has its C path,
  a fourth run, unthrottled with ``--jobs 1`` and ``SCHEMALESS_NO_C=1``, is the A/B of
  the C path against the Python path in the same run.  For each: its
  time against the ALTER, the Cleaner processes' CPU per entity, the servers' CPU
  against the insert floor's (less what the writer costs them: their CPU per second
  during the grace period, times the backfill's seconds), and the writer's p99 during
  the backfill against its p99 during that run's grace period (idle: the same writer,
  the same indexes maintained, no backfill running; at least ``Config.idle_seconds``).
"""

from __future__ import annotations

import json
import os
import py_compile
import re
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from schemaless import Index
from schemaless.local import LocalCluster
from schemaless.names import quote
from schemaless.scatter import shard_is

from .measure import percentile
from .ops import Bench, raw_decode

if TYPE_CHECKING:
    from .harness import Config

__all__ = ["backfill_bench"]

T = TypeVar("T")

NEW_INDEX = Index("by_updated", {"updated": "int"}, shard_on="updated")
#: The writer's idle window before each Cleaner run, at least (seconds): ~1,500 puts.


def _json_doc(entity: dict[str, Any]) -> str:
    return json.dumps(
        {k: (v.hex() if isinstance(v, bytes) else v) for k, v in entity.items()},
        separators=(",", ":"),
    )


def load_json(b: Bench, n: int, batch: int = 1000) -> float:
    """The entities as JSON documents, one ``docs`` table per server; seconds taken."""
    db = f"{b.prefix}_json"
    t0 = time.perf_counter()
    for sid in range(len(b.servers.addresses)):
        b.raw.run(
            sid,
            f"CREATE DATABASE IF NOT EXISTS {quote(db)};"
            + ";".join(
                f"CREATE TABLE IF NOT EXISTS {quote(db, t)} ("
                " `id` BINARY(16) NOT NULL PRIMARY KEY, `doc` JSON NOT NULL) ENGINE=InnoDB"
                for t in ("docs", "docs_all")
            ),
        )
    for start in range(0, n, batch):
        per_sid: dict[int, list[Any]] = {}
        every: list[Any] = []
        for i in range(start, min(n, start + batch)):
            entity = b.ds.entity(i)
            sid = b.shard_sid[b.id_shard(entity["id"])]
            doc = (entity["id"], _json_doc(entity))
            per_sid.setdefault(sid, []).extend(doc)
            every.extend(doc)
        for sid, table, params in [(s, "docs", p) for s, p in per_sid.items()] + [
            (0, "docs_all", every)
        ]:
            rows = ", ".join(["(%s, %s)"] * (len(params) // 2))
            b.raw.run(sid, f"INSERT INTO {quote(db, table)} (`id`, `doc`) VALUES {rows}", params)
    return time.perf_counter() - t0


def alter(b: Bench, single: bool) -> float:
    """``ALTER TABLE ... ADD COLUMN ... VIRTUAL, ADD INDEX``: on the one table holding
    every document, or on every server's share in parallel; seconds."""
    table = quote(f"{b.prefix}_json", "docs_all" if single else "docs")
    sql = (
        f"ALTER TABLE {table} ADD COLUMN `v` BIGINT AS (JSON_VALUE(`doc`, '$.updated'))"
        " VIRTUAL, ADD INDEX `by_v` (`v`)"
    )
    sids = [0] if single else list(range(len(b.servers.addresses)))
    calls: dict[int, tuple[str, list[Any]]] = {sid: (sql, []) for sid in sids}
    t0 = time.perf_counter()
    b.raw.fanout(calls)
    return time.perf_counter() - t0


def naive_backfill(b: Bench, batch: int = 1000) -> tuple[float, int]:
    """The naive loop into the raw twin's shards; (seconds, rows written)."""
    index = NEW_INDEX
    for sid in range(len(b.servers.addresses)):
        ddl = [
            index.create_table_sql(b.raw_db("i3", s))
            for s in range(b.n_shards)
            if b.shard_sid[s] == sid
        ]
        b.raw.run(sid, ";\n".join(ddl))
    written = 0
    t0 = time.perf_counter()
    topo = b.stores["i3"].cluster.current()
    for shard in range(b.n_shards):
        sid = b.shard_sid[shard]
        table = quote(topo.dbs[shard], "entities")
        after = 0
        while True:
            rows = b.raw.run(
                sid,
                f"SELECT `added_id`, `id`, `version`, `body` FROM {table}"
                f" WHERE {shard_is(topo, shard)}`added_id` > %s ORDER BY `added_id` LIMIT %s",
                (after, batch),
            )[0]
            if not rows:
                break
            after = int(rows[-1][0])
            targets: dict[int, list[Any]] = {}
            for _, key, version, body in rows:
                if body is None:
                    continue
                for row in index.rows(_decode(b, body)):
                    target = b.row_shard(index, row)
                    targets.setdefault(target, []).extend((*row, bytes(key), int(version)))
            for target, params in targets.items():
                b.raw.run(b.shard_sid[target], _upsert_sql(b, target, len(params) // 3), params)
                written += len(params) // 3
            if len(rows) < batch:
                break
    return time.perf_counter() - t0, written


def insert_floor(b: Bench, batch: int = 2000) -> tuple[float, int]:
    """Only the inserts of a backfill, every statement's text built before the clock
    starts: the same multi-row upserts into fresh tables of the index's shape,
    ``batch`` rows a statement, both servers in parallel; (seconds, rows).  What the
    servers need to add the rows one by one, whatever the client does."""
    index = NEW_INDEX
    topo = b.stores["i3"].cluster.current()
    params: dict[int, list[list[Any]]] = {}  # server -> rows
    for shard in range(b.n_shards):
        ddl = f"DROP TABLE IF EXISTS {quote(b.raw_db('i3', shard), index.table)};" + (
            index.create_table_sql(b.raw_db("i3", shard))
        )
        b.raw.run(b.shard_sid[shard], ddl)
        rows = b.raw.run(
            b.shard_sid[shard],
            f"SELECT `id`, `version`, `body` FROM {quote(topo.dbs[shard], 'entities')}"
            f" WHERE {shard_is(topo, shard)}`body` IS NOT NULL",
        )[0]
        for key, version, body in rows:
            for row in index.rows(_decode(b, body)):
                target = b.row_shard(index, row)
                params.setdefault(b.shard_sid[target], []).append(
                    [target, *row, bytes(key), int(version)]
                )
    # The whole text of every statement, literals included, is built here, before
    # the clock starts: the timed part is the servers' work and the round trips.
    plans: dict[int, list[tuple[str, list[Any]]]] = {}
    for sid, all_rows in params.items():
        all_rows.sort()
        for lo in range(0, len(all_rows), batch):
            chunk = all_rows[lo : lo + batch]
            stmts = []
            for target in sorted({r[0] for r in chunk}):
                part = [r[1:] for r in chunk if r[0] == target]
                marks = _upsert_sql(b, target, len(part))
                stmts.append(marks % tuple(_literal(v) for r in part for v in r))
            plans.setdefault(sid, []).append(
                ("START TRANSACTION;" + ";".join(stmts) + ";COMMIT", [])
            )
    t0 = time.perf_counter()
    for n in range(max((len(p) for p in plans.values()), default=0)):
        b.raw.fanout({sid: p[n] for sid, p in plans.items() if n < len(p)})
    return time.perf_counter() - t0, sum(len(r) for r in params.values())


def _literal(value: Any) -> str:
    """An int or a bytes value as SQL text (hex for bytes)."""
    return f"X'{value.hex()}'" if isinstance(value, bytes) else str(int(value))


def _decode(b: Bench, body: bytes) -> dict[str, Any]:
    """An entity body of the raw twin (raw codec) or of the datastore (its codec)."""
    return raw_decode(body) if body[1] in (0, 1) else b.stores["i3"].codec.decode(body)


def _upsert_sql(b: Bench, shard: int, rows: int) -> str:
    """A multi-row upsert of ``rows`` NEW_INDEX rows into the raw twin's ``shard``."""
    cols = ", ".join(quote(c) for c in NEW_INDEX.columns)
    marks = ", ".join(["(%s, %s, %s)"] * rows)
    return (
        f"INSERT INTO {quote(b.raw_db('i3', shard), NEW_INDEX.table)}"
        f" ({cols}, `entity_id`, `entity_version`) VALUES {marks}"
        " ON DUPLICATE KEY UPDATE"
        " `entity_version` = GREATEST(`entity_version`, VALUES(`entity_version`))"
    )


def _against_alter(
    took: float, rows: int, single: float, sharded: float, note: str
) -> dict[str, Any]:
    return {
        "seconds": round(took, 3),
        "rows": rows,
        "vs_alter": round(took / single, 2),
        "vs_alter_sharded": round(took / sharded, 2),
        "note": note,
    }


class _Writer(threading.Thread):
    """Puts new entities in a loop, recording (end time, latency) of each."""

    def __init__(self, b: Bench) -> None:
        super().__init__(daemon=True)
        self.b = b
        self.stop = threading.Event()
        self.samples: list[tuple[float, float]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        store = self.b.stores["i3"]
        try:
            while not self.stop.is_set():
                entity = self.b.ds.entity(next(self.b.next_new))
                t0 = time.perf_counter()
                store.put(entity)
                t1 = time.perf_counter()
                self.samples.append((t1, t1 - t0))
                time.sleep(0.002)  # a steady writer, not a saturating one
        except BaseException as exc:
            self.error = exc

    def window(self, start: float, stop: float) -> list[float]:
        return sorted(lat for end, lat in self.samples if start <= end - lat and end <= stop)

    def series(
        self, start: float, zero: float, stop: float, step: float = 0.5
    ) -> list[list[float]]:
        """``[t, p50 ms, p99 ms]`` per ``step`` seconds from ``start`` to ``stop``, ``t``
        the bucket's start in seconds after ``zero`` (the plot of docs/benchmarks.md)."""
        buckets: dict[int, list[float]] = {}
        for end, lat in self.samples:
            if start <= end - lat and end <= stop:
                buckets.setdefault(int((end - lat - start) / step), []).append(lat)
        return [
            [round(start + k * step - zero, 2)]
            + [round(percentile(sorted(lats), q) * 1000, 2) for q in (50, 99)]
            for k, lats in sorted(buckets.items())
        ]


def _server_pids(b: Bench, local_dir: str) -> list[int]:
    """The local cluster's ``mariadbd`` pids, when the benchmark runs on that cluster."""
    cluster = LocalCluster(local_dir)
    if tuple(cluster.addresses) != tuple(b.servers.addresses):
        return []
    pids = [s.pid() for s in cluster.servers]
    return [p for p in pids if p is not None] if all(pids) else []


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used (``/proc/<pid>/stat``)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _settle(pids: list[int], busy: float = 0.1, limit: float = 60.0) -> float:
    """Wait until the servers use less than ``busy`` of a core over a second (InnoDB's
    purge and flushing after the references' million-row writes, if any is left, would
    land on the first Cleaner run and its idle window), at most ``limit`` seconds; the
    seconds waited."""
    start = time.perf_counter()
    while pids and time.perf_counter() - start < limit:
        before = _cpu_seconds(pids)
        time.sleep(1.0)
        if _cpu_seconds(pids) - before < busy:
            break
    return time.perf_counter() - start


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CleanerRun:
    """One Cleaner configuration of the benchmark."""

    key: str  # its name in the results
    index: Index
    jobs: int
    throttle: bool
    #: the Cleaner's environment on top of this process's (``SCHEMALESS_NO_C``)
    env: tuple[tuple[str, str], ...] = ()
    #: keep its progress lines (the throttle's limit and reason every 5 s)
    progress: bool = False


def cleaner_runs(jobs: int, throttled_jobs: int = 1, python_path: bool = False) -> list[CleanerRun]:
    """The runs, in order: the default throttle with ``throttled_jobs``, then
    unthrottled with ``jobs`` and with 1; with ``python_path``, last, unthrottled with
    one process on the Python path only (the A/B of the C path)."""

    def index(n: int) -> Index:
        return Index(f"{NEW_INDEX.name}_{n}", {"updated": "int"}, shard_on="updated")

    runs = [
        CleanerRun("cleaner_throttled", index(1), throttled_jobs, True, progress=True),
        CleanerRun("cleaner", index(2), jobs, False),
        CleanerRun("cleaner_jobs1", index(3), 1, False),
    ]
    if python_path:
        no_c = (("SCHEMALESS_NO_C", "1"),)
        runs.append(CleanerRun("cleaner_python", index(4), 1, False, env=no_c))
    return runs


def _c_path_built() -> bool:
    """Whether the Cleaner has its C path here (then a run on its Python path is the
    A/B)."""
    from schemaless.cleaner.native import rows

    return rows is not None


def _compiled() -> None:
    """Write the bytecode of the Cleaner's modules, as an installed wheel has it: the
    Cleaner's processes then do not compile the project's sources at every start (an
    editable install with PYTHONDONTWRITEBYTECODE set, as on the development machine,
    would, and the compile would count as the Cleaner's CPU)."""
    import schemaless.cleaner.main  # noqa: F401  (what the cleaner command imports)

    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.startswith("schemaless") and path and path.endswith(".py"):
            py_compile.compile(path, doraise=True)


def _run_cleaner(
    b: Bench, run: CleanerRun, local_dir: str, pids: list[int], args: Sequence[str] = ()
) -> tuple[float, str, str, str, dict[str, float]]:
    """Backfill ``run.index`` with ``cleaner --index=NAME --jobs N`` and the options
    ``args``; (seconds, state, how it ran, its output's tail, CPU seconds used by the
    Cleaner's processes and, on the local cluster, by the servers ``pids``)."""
    store = b.stores["i3"]
    exe = Path(sys.executable).with_name("cleaner")
    if not exe.exists():
        raise RuntimeError(f"no cleaner command beside {sys.executable}: install the package")
    env = dict(os.environ)
    env["SCHEMALESS_LOCAL_DIR"] = local_dir
    env.pop("SCHEMALESS_URL", None)
    env.update(run.env)
    cmd = [
        str(exe),
        f"--index={run.index.name}",
        f"--prefix={b.prefix}_i3",
        f"--jobs={run.jobs}",
        *([] if run.progress else ["--quiet"]),
        *([] if run.throttle else ["--no-throttle"]),
        *args,
    ]
    servers_cpu, cleaner_cpu = _cpu_seconds(pids), _children_cpu()
    t0 = time.perf_counter()
    # A session of its own, as a service manager starts a daemon (and as the servers
    # run): the Cleaner then gives its autogroup its --nice (cleaner/priority.py).
    proc = subprocess.run(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    took = time.perf_counter() - t0
    cpu = {"cleaner_cpu_s": round(_children_cpu() - cleaner_cpu, 2)}
    if pids:
        cpu["servers_cpu_s"] = round(_cpu_seconds(pids) - servers_cpu, 2)
    state = store.cluster.refresh().indexes[run.index.name].state
    how = " ".join([*(f"{k}={v}" for k, v in run.env), "cleaner", *cmd[1:]])
    how += f" (exit {proc.returncode})"
    return took, state, how, proc.stdout.decode(errors="replace").strip(), cpu


_PROGRESS = re.compile(r"progress: [^:]+: (.*)")


def _split_output(output: str) -> tuple[str, list[str]]:
    """A Cleaner's output: its tail without the progress lines (the summary), and the
    progress lines (rows, rows/s, the throttle's limit and why), timestamps dropped."""
    progress: list[str] = []
    rest: list[str] = []
    for line in output.splitlines():
        m = _PROGRESS.search(line)
        if m:
            progress.append(m.group(1))
        else:
            rest.append(line)
    return "\n".join(rest)[-600:], progress


def _cleaner_run(
    b: Bench,
    cfg: Config,
    writer: _Writer,
    run: CleanerRun,
    pids: list[int],
    alter: float,
    floor_cpu: float,
) -> dict[str, Any]:
    """Declare ``run.index``, wait out its grace period (the writer's idle window), run
    the Cleaner; its figures and the writer's latencies idle and during (``pids``: the
    servers' processes on the local cluster, none elsewhere)."""
    store = b.stores["i3"]
    store.declare_index(run.index)
    info = store.cluster.refresh().indexes[run.index.name]
    # The Cleaner waits until every writer maintains the index: two catalog refresh
    # intervals after the declaration, plus one second.  Wait here (the writer's idle
    # window), so the Cleaner's time is its scan; at least idle_seconds, so that the idle p99
    # is not the few slowest of a few hundred puts.
    grace_end = info.changed / 1e6 + 2 * store.cluster.topology.refresh_interval + 1.5
    idle_start = time.perf_counter()
    idle_cpu = _cpu_seconds(pids)
    time.sleep(max(cfg.idle_seconds, grace_end - time.time()))
    idle_stop = time.perf_counter()
    # the servers' CPU per second for the writer alone, to take out of the backfill's
    writer_cpu = (_cpu_seconds(pids) - idle_cpu) / (idle_stop - idle_start)
    took, state, how, output, cpu = _run_cleaner(
        b, run, cfg.cluster_dir_abs, pids, cfg.cleaner_args
    )
    during_stop = time.perf_counter()
    summary, progress = _split_output(output)
    # The Cleaner's own clock ("done after N s": from opening the datastore to ready)
    # leaves out the interpreter's start; fall back to the process's wall time.
    own = max(
        (float(t) for t in re.findall(r"(?:done|ready) after ([0-9.]+)s", summary)), default=took
    )
    out: dict[str, Any] = {
        "seconds": round(own, 3),
        "process_seconds": round(took, 3),
        "state": state,
        "how": how,
        "summary": summary,
        **({"progress": progress} if progress else {}),
        "vs_alter": round(own / alter, 2),
        # the throttle's signals that held the copy back, as its summary names them
        "held": " ".join(re.findall(r"throttled [0-9.]+s \([^)]*\)", summary)),
        "cpu_us_per_entity": round(cpu["cleaner_cpu_s"] * 1e6 / cfg.entities, 1),
        **cpu,
        "cores": os.cpu_count(),
    }
    if "servers_cpu_s" in cpu:
        net = max(0.0, cpu["servers_cpu_s"] - writer_cpu * took)
        out["servers_writer_cpu_s"] = round(writer_cpu * took, 2)
        out["servers_backfill_cpu_s"] = round(net, 2)
        if floor_cpu > 0:
            out["servers_vs_floor"] = round(net / floor_cpu, 2)
    idle = writer.window(idle_start + 0.5, idle_stop)
    during = writer.window(during_stop - took, during_stop)
    if idle and during:
        p_idle, p_during = percentile(idle, 99), percentile(during, 99)
        out["writer"] = {
            "idle_ops": len(idle),
            "during_ops": len(during),
            "idle_p50_ms": round(percentile(idle, 50) * 1000, 3),
            "idle_p99_ms": round(p_idle * 1000, 3),
            "during_p50_ms": round(percentile(during, 50) * 1000, 3),
            "during_p99_ms": round(p_during * 1000, 3),
            "p99_ratio": round(p_during / p_idle, 2),
        }
        out["writer_series"] = writer.series(idle_start + 0.5, during_stop - took, during_stop)
    return out


def backfill_bench(b: Bench, cfg: Config) -> dict[str, Any]:
    """Time the backfills; the writer's p99 idle and during each of the Cleaner's."""
    n = cfg.entities
    out: dict[str, Any] = {"entities": n, "index": NEW_INDEX.to_dict()}
    out["json_load_s"] = round(load_json(b, n), 2)
    pids = _server_pids(b, cfg.cluster_dir_abs)  # none on servers elsewhere

    def servers_cpu(f: Callable[[], T]) -> tuple[T, dict[str, float]]:
        """``f()`` and the servers' CPU seconds meanwhile (on the local cluster)."""
        before = _cpu_seconds(pids)
        result = f()
        return result, {"servers_cpu_s": round(_cpu_seconds(pids) - before, 2)} if pids else {}

    single, single_cpu = servers_cpu(lambda: alter(b, single=True))
    sharded, sharded_cpu = servers_cpu(lambda: alter(b, single=False))
    out["alter"] = {
        "seconds": round(single, 3),
        "per_million_s": round(single * 1e6 / n, 2),
        "note": "one table with every document, on one server",
        **single_cpu,
    }
    out["alter_sharded"] = {
        "seconds": round(sharded, 3),
        "per_million_s": round(sharded * 1e6 / n, 2),
        "note": "one table per server, that server's documents, servers in parallel",
        **sharded_cpu,
    }

    out["naive"] = _against_alter(
        *naive_backfill(b),
        single,
        sharded,
        "single thread: scan by added_id, decode, multi-row INSERT per target shard",
    )
    (took, rows), floor_cpu = servers_cpu(lambda: insert_floor(b))
    out["insert_floor"] = (
        _against_alter(
            took,
            rows,
            single,
            sharded,
            "the inserts alone: statements built before the clock, 2000 rows each,"
            " servers in parallel",
        )
        | floor_cpu
    )

    _compiled()
    out["settle_s"] = round(_settle(pids), 1)
    writer = _Writer(b)
    writer.start()
    same = "cleaner_jobs1" if cfg.throttled_jobs == 1 else "cleaner"
    try:
        for run in cleaner_runs(cfg.cleaner_jobs, cfg.throttled_jobs, _c_path_built()):
            out[run.key] = _cleaner_run(
                b, cfg, writer, run, pids, single, floor_cpu.get("servers_cpu_s", 0.0)
            )
        pairs = [throttle_pair(out["cleaner_throttled"], out[same])]
        for n in range(1, cfg.throttle_pairs):
            runs = pair_runs(n, cfg.throttled_jobs)
            done = (_run_and_drop(b, cfg, writer, r, pids, single) for r in runs)
            pairs.append(throttle_pair(*done))
    finally:
        writer.stop.set()
        writer.join()
    if writer.error is not None:
        raise writer.error
    out["cleaner_throttled"]["speed_vs_unthrottled"] = pairs[0]["speed"]
    out["throttle_pairs"] = pairs
    return out


def pair_runs(n: int, jobs: int) -> tuple[CleanerRun, CleanerRun]:
    """The ``n``-th extra pair: the default throttle, then unthrottled, ``jobs`` each."""

    def index(k: int) -> Index:
        return Index(f"{NEW_INDEX.name}_p{n}_{k}", {"updated": "int"}, shard_on="updated")

    throttled = CleanerRun(f"pair{n}_throttled", index(1), jobs, True, progress=True)
    return throttled, CleanerRun(f"pair{n}_unthrottled", index(2), jobs, False)


def throttle_pair(throttled: dict[str, Any], unthrottled: dict[str, Any]) -> dict[str, Any]:
    """One pair's figures: the throttled copy's speed against the unthrottled one's
    (as many processes, the same run), and the writer's p99 during it against idle."""
    w = throttled.get("writer", {})
    return {
        "throttled_s": throttled["seconds"],
        "unthrottled_s": unthrottled["seconds"],
        "speed": round(unthrottled["seconds"] / throttled["seconds"], 2),
        "p99_ratio": w.get("p99_ratio"),
        "idle_p99_ms": w.get("idle_p99_ms"),
        "during_p99_ms": w.get("during_p99_ms"),
        "held": throttled.get("held", ""),
    }


def _run_and_drop(
    b: Bench, cfg: Config, writer: _Writer, run: CleanerRun, pids: list[int], alter: float
) -> dict[str, Any]:
    """A Cleaner run of an extra pair, then its index dropped and purged (the writer,
    on the same store, stops maintaining it at once; it maintains as many indexes in
    every pair after the first)."""
    out = _cleaner_run(b, cfg, writer, run, pids, alter, 0.0)
    b.stores["i3"].drop_index(run.index.name)
    b.stores["i3"].purge_index(run.index.name)
    return out
