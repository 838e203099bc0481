"""The module tables in a dump: those ``schemaless.edges`` and ``schemaless.feeds``
make on first use in the owned layout's data database (``movesync.discovered``).

A table with a ``shard`` column is dumped per logical shard in that shard's entity
snapshot (``tables/<table>/shard-NNNN.<encoding>``, ``shard`` left out), a server-wide
one (a feed's pulled list) once, from one server (``tables/<table>/all.<encoding>``);
the manifest's ``tables`` has each one's ``SHOW CREATE TABLE``, columns, key and
per-file row counts (``TableDump``).  Restore reads every table file through first
(a bad one is refused before anything is written), creates the tables as dumped (only
a definition of the allowed form is ever run), a sharded one with the guard, and
writes a row into the logical shard of the first key column after ``shard`` (an id:
src, node, user, author), so edges, their counts and timelines follow their node into
any shard count; a server-wide table's rows go onto every server.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import msgpack
import MySQLdb.cursors

from .dumpfiles import MANIFEST, PAGE, DumpError, Progress, not_empty, restore_file
from .edgetables import NOCOUNT, PAIRING, triggers_sql
from .hashing import shard_of
from .jsonform import from_json, to_jsonable
from .movesync import discovered, table_names
from .names import quote
from .owned import admin, locked
from .scatter import by_server, chunks, sql_bytes

if TYPE_CHECKING:
    from .catalog import Topology
    from .store import DataStore

__all__ = [
    "TABLES",
    "TableDump",
    "check_table_files",
    "discover",
    "dump_tables",
    "dump_wide",
    "no_table_rows",
    "restore_tables",
    "table_dumps",
]

TABLES = "tables"  # the directory of the module tables' files
#: The library's own tables in the data database: never a module table (a counted
#: index's ``counts`` and ``counted_keys`` are rebuilt by its backfill, as index rows).
_LIBRARY = frozenset(
    ("entities", "owned", "owned_digest", "changes", "changes_head", "counts", "counted_keys")
)
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
_IDENT = r"`([a-z][a-z0-9_]{0,63})`"
# What a module table's SHOW CREATE TABLE may hold, line by line: columns of integers
# and bytes, keys, InnoDB options; restore runs nothing else from a dump.
_COLUMN = re.compile(
    rf"  {_IDENT} ((?:tiny|small|medium|big)?int\(\d+\)(?: unsigned)?|(?:var)?binary\(\d+\)"
    r"|(?:tiny|medium|long)?blob)(?: NOT NULL)?(?: DEFAULT (?:NULL|-?\d+))?\Z"
)
_KEY = re.compile(r"  (PRIMARY KEY|(?:UNIQUE )?KEY `[a-z][a-z0-9_]{0,63}`) \(([`a-z0-9_,]+)\)\Z")
# the owned layout's guard (owned.GUARD_KEY), as SHOW CREATE TABLE names it
_GUARD = re.compile(
    r"  CONSTRAINT `[a-z0-9_]{1,64}` FOREIGN KEY \(`shard`\) REFERENCES `owned` \(`shard`\)\Z"
)
_OPTIONS = re.compile(
    r"\) ENGINE=InnoDB(?: (?:DEFAULT )?[A-Z_]+=[A-Za-z0-9_]+)*"
    rf"(?: COMMENT='{PAIRING}')?\Z"  # an edge type's pairing
)
_FILE = re.compile(r"(?:shard-\d{4,5}|all)\.(?:jsonl|native)\Z")


@dataclass(frozen=True, slots=True)
class TableDump:
    """A module table in a dump (the manifest's ``tables`` entry): its ``SHOW CREATE
    TABLE``, whether it is ``guarded`` (rows of logical shards, under the owned
    layout's guard; else a server-wide list), the columns of its files' rows
    (``shard`` left out: restore computes it), its primary key and each file's rows."""

    name: str
    create: str
    sharded: bool
    columns: tuple[str, ...]
    key: tuple[str, ...]
    files: dict[str, int]

    @classmethod
    def of(cls, name: object, create: object) -> TableDump:
        """A module table from its definition; DumpError for one a dump does not carry
        (a library table, another form, a sharded one whose key does not start with
        ``(shard, <16-byte id>)``: the rows' new shard is that id's)."""
        if not isinstance(name, str) or not _NAME.match(name) or _library(name):
            raise DumpError(f"{name!r} is not a module table a dump carries")
        text, types, key = _parse_create(name, create)
        sharded = "shard" in types
        if sharded and (key[:1] != ("shard",) or len(key) < 2 or types[key[1]] != "binary(16)"):
            raise DumpError(
                f"table {name}: its primary key {key} does not start with (shard, a"
                " BINARY(16) id), whose logical shard its rows take in a restore"
            )
        columns = tuple(c for c in types if c != "shard")
        return cls(name, text, sharded, columns, key, {})

    @classmethod
    def from_dict(cls, name: object, entry: object) -> TableDump:
        """The manifest's entry, checked against its definition (DumpError)."""
        if not isinstance(entry, dict):
            raise DumpError(f"{MANIFEST}: table {name!r}: not an object")
        files = entry.get("files")
        table = cls.of(name, entry.get("create"))
        same = (entry.get("columns"), entry.get("key")) == (list(table.columns), list(table.key))
        if (
            not same
            or entry.get("guarded") is not table.sharded
            or not isinstance(files, dict)
            or not all(_file(table, f, n) for f, n in files.items())
        ):
            raise DumpError(
                f"{MANIFEST}: table {name}: its columns, key, guard or files do not match"
                " its definition"
            )
        return dataclasses.replace(table, files=files)

    def as_dict(self) -> dict[str, Any]:
        """The manifest's form."""
        return {
            "create": self.create,
            "guarded": self.sharded,
            "columns": list(self.columns),
            "key": list(self.key),
            "files": self.files,
        }

    def select(self, db: str, shard: int | None) -> str:
        """Its rows (of ``shard``, or all), in key order."""
        where = "" if shard is None else f" FORCE INDEX (PRIMARY) WHERE `shard` = {int(shard)}"
        return (
            f"SELECT {', '.join(quote(c) for c in self.columns)} FROM {quote(db, self.name)}"
            f"{where} ORDER BY {', '.join(quote(c) for c in self.key)}"
        )


def _file(table: TableDump, name: object, rows: object) -> bool:
    """A table file's name (a sharded table's per shard, else one) and row count."""
    if not isinstance(name, str) or not _FILE.match(name):
        return False
    return name.startswith("shard-") == table.sharded and type(rows) is int and rows >= 0


def _library(name: str) -> bool:
    return name in _LIBRARY or name.startswith(("index_", "fence_"))


def _parse_create(name: str, create: object) -> tuple[str, dict[str, str], tuple[str, ...]]:
    """A module table's ``SHOW CREATE TABLE``, its column types and primary key;
    DumpError unless it has exactly the allowed form."""
    text = create if isinstance(create, str) else ""
    lines = text.split("\n")
    bad = DumpError(
        f"table {name}: not a definition a dump carries (InnoDB, columns of integers and"
        f" bytes, a primary key): {str(create)[:300]!r}"
    )
    if len(lines) < 3 or lines[0] != f"CREATE TABLE `{name}` (" or not _OPTIONS.match(lines[-1]):
        raise bad
    types: dict[str, str] = {}
    key: tuple[str, ...] = ()
    for line in lines[1:-1]:
        line = line.removesuffix(",")
        if column := _COLUMN.match(line):
            types[column[1]] = column[2]
        elif (found := _KEY.match(line)) and found[1] == "PRIMARY KEY":
            key = tuple(c.strip("`") for c in found[2].split(","))
        elif not found and not _GUARD.match(line):
            raise bad
    if not key or not set(key) <= set(types):
        raise bad
    return text, types, key


def table_dumps(manifest: dict[str, Any]) -> list[TableDump]:
    """A manifest's module tables, checked (none in a dump made before they were)."""
    found = manifest.get("tables", {})
    if not isinstance(found, dict):
        raise DumpError(f"{MANIFEST}: tables is not an object")
    return [TableDump.from_dict(name, entry) for name, entry in sorted(found.items())]


def discover(
    ds: DataStore, topo: Topology, out: Path
) -> tuple[dict[str, TableDump], dict[int, set[str]]]:
    """The module tables by name (``movesync.discovered`` on every server, the
    definition from the first that has each, the same columns and key on every other,
    else DumpError), the names each server has; their directories made under ``out``."""
    db = topo.owned_db
    if db is None:
        return {}, {}
    tables: dict[str, TableDump] = {}
    present: dict[int, set[str]] = {}
    for sid, server in sorted(ds.cluster.all_servers(topo).items()):
        sharded, wide = discovered(server, db, set(_LIBRARY))
        present[sid] = {n for n in [*(t.name for t in sharded), *wide] if not _library(n)}
        for name in sorted(present[sid]):
            made = server.run(admin([f"SHOW CREATE TABLE {quote(db, name)}"]))[0][0][1]
            table = TableDump.of(name, str(made))
            first = tables.setdefault(name, table)
            if (first.columns, first.key) != (table.columns, table.key):
                raise DumpError(f"table {name} has other columns or key on {server.name}")
    for name in tables:
        (out / TABLES / name).mkdir(parents=True, exist_ok=True)
    return tables, present


def dump_tables(
    topo: Topology,
    shard: int,
    tables: list[TableDump],
    out: Path,
    encoding: str,
    rows: dict[str, dict[str, int]],
    conn: Any,
) -> None:
    """In a shard's snapshot (``conn``'s): its rows of each sharded module table into
    a file, their count into ``rows``."""
    name = f"shard-{shard:04d}.{encoding}"
    for table in tables:
        path = out / TABLES / table.name / name
        rows[table.name][name] = _dump_rows(conn, table.select(str(topo.owned_db), shard), path)


def dump_wide(
    ds: DataStore,
    topo: Topology,
    tables: list[TableDump],
    present: dict[int, set[str]],
    out: Path,
    encoding: str,
    rows: dict[str, dict[str, int]],
) -> None:
    """Each server-wide module table once: from logical shard 0's server, or the
    first that has it (every server keeps the whole list)."""
    servers = ds.cluster.all_servers(topo)
    for table in tables:
        holders = [sid for sid, names in sorted(present.items()) if table.name in names]
        sid = topo.shard_servers[0] if topo.shard_servers[0] in holders else holders[0]
        name = f"all.{encoding}"
        with servers[sid].connection() as conn:
            sql = table.select(str(topo.owned_db), None)
            rows[table.name][name] = _dump_rows(conn, sql, out / TABLES / table.name / name)


def _dump_rows(conn: Any, sql: str, path: Path) -> int:
    """The rows of ``sql`` into ``path`` (msgpack lists, or JSON lists a line in the
    ``$`` convention), streamed; how many."""
    native = path.suffix == ".native"
    part = path.with_name(path.name + ".part")
    n = 0
    cursor = conn.cursor(MySQLdb.cursors.SSCursor)
    try:
        cursor.execute(sql)
        with open(part, "wb") as f:
            while batch := cursor.fetchmany(PAGE):
                for row in batch:
                    values = [bytes(v) if isinstance(v, bytearray) else v for v in row]
                    if native:
                        f.write(msgpack.packb(values, use_bin_type=True))
                    else:
                        f.write((json.dumps(to_jsonable(values)) + "\n").encode())
                n += len(batch)
    finally:
        cursor.close()
    os.replace(part, path)
    return n


def no_table_rows(ds: DataStore, topo: Topology, tables: list[TableDump]) -> None:
    """Refuse a target whose module tables of the dump hold rows: a restore never
    merges (an interrupted one is resumed by its checkpoints instead)."""
    db = str(topo.owned_db)
    for server in ds.cluster.all_servers(topo).values():
        have = sorted(table_names(server, db) & {t.name for t in tables})
        if have:
            got = server.run(admin([f"SELECT EXISTS (SELECT 1 FROM {quote(db, n)})" for n in have]))
            for name, result in zip(have, got, strict=True):
                if result[0][0]:
                    raise not_empty(topo, f"rows in {name}")


def check_table_files(src: Path, tables: list[TableDump]) -> None:
    """Read every table file through: each row well-formed, as many as the manifest says."""
    for table in tables:
        for name, count in table.files.items():
            path = src / TABLES / table.name / name
            try:
                with open(path, "rb") as f:
                    n = sum(1 for _ in _table_rows(f, table))
            except OSError as exc:
                raise DumpError(f"{path}: {exc.strerror or exc}") from None
            if n != count:
                raise DumpError(f"{path}: {n} rows where the manifest says {count}: truncated?")


def _table_rows(f: BinaryIO, table: TableDump) -> Iterator[tuple[Any, ...]]:
    """A table file's rows, checked: lists of the table's columns, integers, bytes or
    null, a sharded one's id 16 bytes (DumpError naming the row)."""
    items: Iterable[Any]
    if f.name.endswith(".native"):
        items = msgpack.Unpacker(f, raw=False, max_buffer_size=64 * 1024 * 1024)
    else:
        items = (from_json(line.decode()) for line in f)
    at = table.columns.index(table.key[1]) if table.sharded else -1
    good = 0
    try:
        for item in items:
            if not isinstance(item, list) or len(item) != len(table.columns):
                raise ValueError(f"not a list of {len(table.columns)} values")
            if any(v is not None and type(v) not in (int, bytes) for v in item):
                raise ValueError("a value that is not an integer, bytes or null")
            if at >= 0 and not (isinstance(item[at], bytes) and len(item[at]) == 16):
                raise ValueError(f"{table.key[1]} is not a 16-byte id")
            good += 1
            yield tuple(item)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise DumpError(f"{f.name}: row {good + 1}: {exc}") from None


def restore_tables(
    ds: DataStore,
    topo: Topology,
    src: Path,
    job: str,
    tables: list[TableDump],
    workers: int,
    progress: Progress | None,
) -> None:
    """Create the module tables on every server (a sharded one with the guard), then
    write their files' rows, each file resumed from its checkpoint (``job:<table>``)."""
    if not tables:
        return
    ds.cluster.on_dbs(
        topo,
        lambda db: [
            stmt
            for t in tables
            for stmt in [
                f"CREATE TABLE IF NOT EXISTS {quote(db, t.name)} {t.create.split(' ', 3)[3]}",
                *(triggers_sql(db, t.name, t.create) if t.sharded else []),
            ]
        ],
    )
    done = {t.name: ds.cluster.catalog.checkpoints(f"{job}:{t.name}") for t in tables}

    def one(item: tuple[TableDump, str]) -> None:
        table, name = item
        shard = int(name[6:].split(".")[0]) if table.sharded else 0
        position, finished, _ = done[table.name].get(shard, (0, False, 0))
        if finished:
            if progress is not None:
                progress(table.files[name])
            return
        with open(src / TABLES / table.name / name, "rb") as f:
            write = functools.partial(_write_rows if table.sharded else _write_wide, ds, table)
            rows = _table_rows(f, table)
            restore_file(ds, f"{job}:{table.name}", shard, rows, write, position, progress)

    files = [(t, name) for t in tables for name in sorted(t.files)]
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="schemaless-restore") as pool:
        list(pool.map(one, files))


def _write_rows(ds: DataStore, table: TableDump, rows: list[tuple[Any, ...]]) -> None:
    """Rows of a sharded module table, each into the logical shard of its id (the key's
    column after ``shard``), through the guard: one transaction per server, edges
    uncounted (``NOCOUNT``: their counts are rows of the dump too)."""
    topo = ds.cluster.current()
    at = table.columns.index(table.key[1])

    def shard(row: tuple[Any, ...]) -> int:
        return shard_of(row[at], topo.n_shards)

    def build(part: list[tuple[Any, ...]]) -> tuple[str, list[Any]]:
        shards = {shard(r) for r in part}
        stmt = _insert_sql(str(topo.owned_db), table.name, ("shard", *table.columns), len(part))
        stmts = [f"SET {NOCOUNT} = 1", stmt, f"SET {NOCOUNT} = NULL"]
        return locked(stmts, topo.owned_db, shards), [v for r in part for v in (shard(r), *r)]

    for part in chunks(rows, sql_bytes, ds.cluster.max_batch_bytes):
        ds.cluster.scatter(topo, by_server(topo, part, shard), build)


def _write_wide(ds: DataStore, table: TableDump, rows: list[tuple[Any, ...]]) -> None:
    """Rows of a server-wide module table onto every server (administrative, as the
    writers' own: rows of no logical shard)."""
    topo = ds.cluster.current()

    def build(part: list[tuple[Any, ...]]) -> tuple[str, list[Any]]:
        stmt = _insert_sql(str(topo.owned_db), table.name, table.columns, len(part))
        return admin([stmt]), [v for r in part for v in r]

    for part in chunks(rows, sql_bytes, ds.cluster.max_batch_bytes):
        ds.cluster.scatter(topo, {sid: part for sid in topo.servers}, build)


def _insert_sql(db: str, name: str, columns: tuple[str, ...], n: int) -> str:
    """Insert ``n`` rows, a row already there kept (rewriting a batch changes nothing)."""
    one = "(" + ", ".join(["%s"] * len(columns)) + ")"
    first = quote(columns[0])
    return (
        f"INSERT INTO {quote(db, name)} ({', '.join(quote(c) for c in columns)}) VALUES "
        + ", ".join([one] * n)
        + f" ON DUPLICATE KEY UPDATE {first} = {first}"
    )
