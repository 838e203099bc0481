"""Logical dump and restore: every live entity (id, body, version) and the index
definitions, out to a directory and back into a datastore of any shard count.

A dump directory holds one file per source logical shard, ``shard-NNNN.jsonl`` (one
JSON object a line: ``version``, ``updated`` and the ``entity`` in the CLI's ``$``
convention for bytes, UUIDs and datetimes) or ``shard-NNNN.native`` (msgpack records
``[id, version, updated, body]`` with the stored body as is: no decoding, and the codec
dictionaries it names in the manifest), and ``manifest.json``, written last: the
encoding, the source's prefix, shard count and layout, its settings (the expiry property and
whether the change feed is on), the index definitions (unique ones flagged) and each
file's entity count.  Each shard is read in its own ``START TRANSACTION WITH CONSISTENT
SNAPSHOT``, shards in parallel; the dump is a snapshot per shard, not across shards.
In the owned layout a shard's rows are ``WHERE shard = s`` of the server's one table, and
the snapshot's ownership check proves they are all of them (a move's fence came later).
The format is the same in both layouts: a dump of a datastore in the layout of a
database per logical shard restores into an owned one, the way over for existing ones.

The owned layout's module tables (``schemaless.edges``, ``schemaless.feeds``: the
data database's tables made on first use, ``movesync.discovered``) are dumped too:
a table with a ``shard`` column in ``tables/<table>/shard-NNNN.<encoding>``, its rows
of that shard read in the shard's snapshot (``shard`` left out), a server-wide one
(a feed's pulled list) once, from one server, in ``tables/<table>/all.<encoding>``;
the manifest's ``tables`` has each one's ``SHOW CREATE TABLE``, columns, key and
per-file row counts (``TableDump``).

Restore gives a target with the default settings the dump's, and refuses a target
whose settings differ (a dump made before settings were carried restores as before,
with a warning).  It writes the entity rows directly (``INSERT ... ON DUPLICATE KEY UPDATE`` that
keeps the larger version: idempotent), before any index exists, then declares the
dump's indexes: on a datastore with entities they are ``building``, so the Cleaner's
backfill (run by ``schemaless restore`` unless told not to) writes their rows.  So the
index protocol is never bypassed: no index is maintained while entities are written
behind its back.  In the owned layout the rows carry their shard, through the guard
(the target owns its shards: one it does not refuses the batch).  A checkpoint per
source file in the target's catalog (``restore:<dump id>``) lets an interrupted restore
resume; rewriting a batch twice changes nothing.  Module tables are restored after the
entities (every table file is read through first: a bad one is refused before anything
is written), created as dumped, with the guard for a sharded one: a row goes to the
logical shard of the first key column after ``shard`` (an id: src, node, user,
author), so edges, their counts and timelines follow their node into any shard count;
a server-wide table's rows go onto every server.  A target in the layout of a
database per shard refuses a dump with module tables.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import msgpack
import MySQLdb
import MySQLdb.cursors

from .catalog import IndexState, Topology
from .codec import Codec
from .errors import CatalogError, CorruptEntity, InvalidEntity, SchemalessError, ServerError
from .expiry import check_property
from .feed import enable_changes
from .hashing import shard_of
from .ids import id_hex, to_id
from .index import Index
from .jsonform import from_json, to_jsonable
from .movesync import discovered, table_names
from .names import quote
from .owned import admin, check_sql, guard_sql, locked
from .scatter import STATEMENT_BYTES, by_server, chunks, shard_is, sql_bytes
from .store import DataStore

__all__ = [
    "ENCODINGS",
    "MANIFEST",
    "Record",
    "Settings",
    "TableDump",
    "dump",
    "read_manifest",
    "restore",
    "table_dumps",
]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
ENCODINGS = ("jsonl", "native")
_FORMAT = 1
_PAGE = 2000  # rows per read inside a shard's snapshot
_BATCH = 1000  # records per restore round (one statement batch per server)

Progress = Callable[[int], None]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Record:
    """One entity as dumped: its id, version, ``updated`` (µs) and stored body."""

    id: bytes
    version: int
    updated: int
    body: bytes


class DumpError(CatalogError):
    """A dump directory that cannot be written or read back."""


@dataclass(frozen=True, slots=True)
class Settings:
    """The datastore settings a dump carries (the manifest's ``settings``)."""

    expire_on: str | None
    changes: bool

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> Settings | None:
        """The manifest's settings; None for a dump made before they were carried."""
        found = manifest.get("settings")
        if found is None:
            return None
        try:
            prop = found["expire_on"]
            changes = found["changes"]
            if not isinstance(changes, bool):
                raise TypeError(f"changes must be true or false, got {changes!r}")
            return cls(None if prop is None else check_property(prop), changes)
        except (TypeError, KeyError, SchemalessError) as exc:
            raise DumpError(f"{MANIFEST}: bad settings {found!r} ({exc})") from None

    def as_dict(self) -> dict[str, Any]:
        """The manifest's form."""
        return {"expire_on": self.expire_on, "changes": self.changes}


# -- dump ------------------------------------------------------------------------------


def dump(
    ds: DataStore,
    directory: str | Path,
    *,
    encoding: str = "jsonl",
    workers: int = 4,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Dump every live entity and the index definitions; return the manifest.

    ``directory`` must not hold a dump already; ``progress(n)`` is called with the
    entities of each page read (from several threads)."""
    if encoding not in ENCODINGS:
        raise DumpError(f"unknown dump encoding {encoding!r}: use one of {', '.join(ENCODINGS)}")
    out = Path(directory)
    if (out / MANIFEST).exists() or any(out.glob("shard-*")) or (out / TABLES).exists():
        raise DumpError(f"{out} already holds a dump: choose an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    topo = ds.cluster.refresh()
    if topo.moves:
        raise CatalogError("logical shards are being moved: dump once the moves have finished")
    indexes = [
        info.index.to_dict() for info in topo.indexes.values() if info.state != IndexState.DROPPED
    ]
    tables, present = _discover(ds, topo, out)
    rows: dict[str, dict[str, int]] = {name: {} for name in tables}

    def one(shard: int) -> tuple[int, set[int]]:
        here = present.get(topo.shard_servers[shard], set())
        mine = [t for name, t in sorted(tables.items()) if t.sharded and name in here]
        then = functools.partial(_dump_tables, topo, shard, mine, out, encoding, rows)
        return _dump_shard(ds, topo, shard, out / f"shard-{shard:04d}.{encoding}", progress, then)

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="schemaless-dump") as pool:
        results = list(pool.map(one, range(topo.n_shards)))
    _dump_wide(
        ds, topo, [t for t in tables.values() if not t.sharded], present, out, encoding, rows
    )
    dict_ids = set().union(*(ids for _, ids in results))
    manifest = {
        "format": _FORMAT,
        "dump_id": uuid.uuid4().hex,
        "encoding": encoding,
        "prefix": topo.prefix,
        "shards": topo.n_shards,
        "layout": topo.layout,  # the source's (for the record: restore takes any)
        "settings": Settings(topo.expire_on, topo.changes).as_dict(),
        "indexes": indexes,
        "files": {f"shard-{s:04d}.{encoding}": n for s, (n, _) in enumerate(results)},
        "dictionaries": {str(i): ds.cluster.catalog.dictionary(i).hex() for i in dict_ids},
        "tables": {
            name: dataclasses.replace(t, files=rows[name]).as_dict() for name, t in tables.items()
        },
    }
    tmp = out / (MANIFEST + ".part")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / MANIFEST)
    return manifest


def _dump_shard(
    ds: DataStore,
    topo: Topology,
    shard: int,
    path: Path,
    progress: Progress | None,
    then: Callable[[Any], None] | None = None,
) -> tuple[int, set[int]]:
    """One logical shard's live entities into ``path``, read in one snapshot (then
    ``then(connection)`` in it); the count, and the codec dictionaries their bodies
    name (native encoding)."""
    server = ds.cluster.server_of_shard(topo, shard)
    # the clustered key (owned layout: (shard, added_id)); never `by_updated` (shard,
    # updated) and a sort of the shard's rows for every page
    sql = (
        f"SELECT `added_id`, `id`, `version`, `updated`, `body` FROM "
        f"{quote(topo.dbs[shard], 'entities')} FORCE INDEX (PRIMARY)"
        f" WHERE {shard_is(topo, shard)}`added_id` > %s ORDER BY `added_id` LIMIT {_PAGE}"
    )
    native = path.suffix == ".native"
    count, dict_ids = 0, set()
    part = path.with_name(path.name + ".part")
    with server.connection() as db, open(part, "wb") as out:
        cursor = db.cursor()
        try:
            # sessions are READ COMMITTED: a snapshot needs REPEATABLE READ
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            if topo.owned_db is not None:  # the snapshot holds the shard's rows: all of them
                cursor.execute(check_sql(topo.owned_db, [shard]))
            after = 0
            while True:
                cursor.execute(sql, (after,))
                rows = cursor.fetchall()
                live = [r for r in rows if r[4] is not None]  # not tombstones
                for _, key, version, updated, body in live:
                    record = Record(bytes(key), int(version), int(updated), bytes(body))
                    if native:
                        dict_id = ds.codec.dictionary_id(record.body)
                        if dict_id is not None:
                            dict_ids.add(dict_id)
                    out.write(_encode(ds, shard, record, native))
                count += len(live)
                if progress is not None and live:
                    progress(len(live))
                if len(rows) < _PAGE:
                    break
                after = rows[-1][0]
            if then is not None:
                then(db)
            cursor.execute("COMMIT")
        except MySQLdb.Error as exc:
            raise ServerError(f"{server.name}: dumping logical shard {shard}: {exc}") from exc
    os.replace(part, path)
    return count, dict_ids


def _encode(ds: DataStore, shard: int, record: Record, native: bool) -> bytes:
    if native:
        packed: bytes = msgpack.packb(
            [record.id, record.version, record.updated, record.body], use_bin_type=True
        )
        return packed
    entity = ds.decode(record.id, shard, record.version, record.body)
    line = {"version": record.version, "updated": record.updated, "entity": to_jsonable(entity)}
    return (json.dumps(line, ensure_ascii=False) + "\n").encode()


# -- restore ---------------------------------------------------------------------------


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """A complete dump's manifest; DumpError if there is none or it is not one."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DumpError(f"{path} is missing: not a dump, or one that did not finish") from None
    except ValueError as exc:
        raise DumpError(f"{path}: not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise DumpError(f"{path}: not a dump manifest of format {_FORMAT}")
    return manifest


def restore(
    ds: DataStore,
    directory: str | Path,
    *,
    workers: int = 4,
    progress: Progress | None = None,
) -> list[str]:
    """Restore a dump into ``ds``; return the names of the indexes left ``building``
    (backfill them: ``Cleaner(ds).backfill(name)`` or ``cleaner --index=NAME``).

    ``ds`` must be empty, or hold an interrupted restore of the same dump, which this
    call finishes.  It gets the dump's settings (expiry property, change feed) unless
    it has other ones, which is refused first.  ``progress(n)`` is called with the
    entities of each batch written (skipped ones included)."""
    src = Path(directory)
    manifest = read_manifest(src)
    indexes = [Index.from_dict(d) for d in manifest["indexes"]]
    settings = Settings.of(manifest)
    job = f"restore:{manifest['dump_id']}"
    tables = table_dumps(manifest)
    topo = ds.cluster.refresh()
    if tables and topo.owned_db is None:
        raise CatalogError(
            f"this dump has edge and feed tables ({', '.join(t.name for t in tables)}), which "
            f"need the owned layout; {topo.prefix!r} has a database per logical shard: restore"
            " into a new datastore in the owned layout (`schemaless init --prefix NEW`)"
        )
    done = _check_target(ds, topo, job, indexes, len(manifest["files"]))
    if not done:
        _no_table_rows(ds, topo, tables)
    _check_table_files(src, tables)  # a bad table file: refused before anything is written
    codec = _dump_codec(ds, manifest)
    _apply_settings(ds, topo, settings)

    def one(name: str) -> None:
        shard = int(name.split("-")[1].split(".")[0])
        position, finished, _ = done.get(shard, (0, False, 0))
        if finished:
            if progress is not None:
                progress(int(manifest["files"][name]))
            return
        with open(src / name, "rb") as f:
            records = _native(f, ds, codec) if name.endswith(".native") else _jsonl(f, ds)
            write = functools.partial(_write, ds)
            _restore_file(ds, job, shard, records, write, position, progress)

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="schemaless-restore") as pool:
        list(pool.map(one, sorted(manifest["files"])))
    _restore_tables(ds, topo, src, job, tables, workers, progress)
    return [
        index.name
        for index in indexes
        if ds.declare_index(index, force=True) == IndexState.BUILDING
    ]


def _check_target(
    ds: DataStore, topo: Topology, job: str, indexes: list[Index], files: int
) -> dict[int, tuple[int, bool, int]]:
    """The checkpoints of this restore; an error if the target is not empty and not
    this restore's, or has indexes the dump does not define."""
    if topo.moves:
        raise CatalogError("logical shards are being moved: restore once they have finished")
    done = ds.cluster.catalog.checkpoints(job)
    names = {index.name: index for index in indexes}
    for name, info in topo.indexes.items():
        if names.get(name) != info.index:
            raise _not_empty(topo, f"index {name!r}, which this dump does not define")
        if sum(d for _, d, _ in done.values()) < files:
            raise _not_empty(topo, f"index {name!r} but no finished restore of this dump")
    if not done and not ds._empty(topo):
        raise _not_empty(topo, "entities")
    return done


def _not_empty(topo: Topology, what: str) -> CatalogError:
    """A target that is neither empty nor this dump's interrupted restore: what to do."""
    return CatalogError(
        f"the target datastore {topo.prefix!r} already has {what}: a restore never merges "
        "into a datastore in use; restore into a new, empty one (`schemaless init --prefix "
        "NEW ...`, then `schemaless restore DIR --prefix NEW`), or drop this one first"
    )


def _apply_settings(ds: DataStore, topo: Topology, settings: Settings | None) -> None:
    """Give the target the dump's settings, or refuse (before anything is written)
    if it has other ones than the defaults and the dump's; a dump without settings
    leaves the target's as they are (a warning)."""
    if settings is None:
        log.warning(
            "this dump was made before dumps carried the datastore's settings: the "
            "expiry property and the change feed of %r are left as they are (set them "
            "with `schemaless expiry PROPERTY` and `schemaless init --changes`)",
            topo.prefix,
        )
        return
    differences = []
    if topo.expire_on is not None and topo.expire_on != settings.expire_on:
        dumped = "never" if settings.expire_on is None else f"on {settings.expire_on!r}"
        differences.append(
            f"it expires entities on {topo.expire_on!r}, the dump's datastore {dumped}"
        )
    if topo.changes and not settings.changes:
        differences.append("it has the change feed on, the dump's datastore had it off")
    if differences:
        raise CatalogError(
            f"the target datastore {topo.prefix!r} has other settings than the dump: "
            f"{'; '.join(differences)}: restore into a new datastore (`schemaless init "
            "--prefix NEW ...`), or give this one the dump's settings first"
        )
    if settings.expire_on is not None and topo.expire_on is None:
        ds._expire_on(settings.expire_on)
    if settings.changes:
        enable_changes(ds.cluster)


def _dump_codec(ds: DataStore, manifest: dict[str, Any]) -> Codec | None:
    """For a native dump whose dictionaries the target lacks: a codec that knows them
    (bodies naming one are re-encoded by the target's codec); None otherwise."""
    foreign = {}
    for text, hex_data in manifest.get("dictionaries", {}).items():
        data = bytes.fromhex(hex_data)
        try:
            if ds.cluster.catalog.dictionary(int(text)) == data:
                continue
        except CatalogError:
            pass
        foreign[int(text)] = data
    if not foreign:
        return None
    codec = Codec(max_body_bytes=ds.codec.max_body_bytes)
    for dict_id, data in foreign.items():
        codec.add_dictionary(dict_id, data)
    return codec


def _restore_file(
    ds: DataStore,
    job: str,
    shard: int,
    records: Iterator[T],
    write: Callable[[list[T]], None],
    position: int,
    progress: Progress | None,
) -> None:
    """Write one dump file's records after the first ``position`` (written by an
    earlier run), saving the checkpoint (``job``, ``shard``) after each batch."""
    n = sum(1 for _ in itertools.islice(records, position))  # written before
    if progress is not None and n:
        progress(n)
    while True:
        batch = list(itertools.islice(records, _BATCH))
        if batch:
            write(batch)
        n += len(batch)
        ds.cluster.catalog.save_checkpoint(job, shard, n, len(batch) < _BATCH, n)
        if progress is not None and batch:
            progress(len(batch))
        if len(batch) < _BATCH:
            return


def _native(f: BinaryIO, ds: DataStore, codec: Codec | None) -> Iterator[Record]:
    for item in msgpack.Unpacker(f, raw=False, max_buffer_size=64 * 1024 * 1024):
        try:
            key, version, updated, body = item
            record = Record(to_id(key), int(version), int(updated), bytes(body))
            dict_id = ds.codec.dictionary_id(record.body)  # checks the header
        except (ValueError, TypeError, SchemalessError) as exc:
            raise CorruptEntity(f"{f.name}: a bad record: {exc}") from None
        if dict_id is not None and codec is not None and codec.has_dictionary(dict_id):
            body = ds.codec.encode(codec.decode(record.body))
            record = Record(record.id, record.version, record.updated, body)
        elif dict_id is not None and not ds.codec.has_dictionary(dict_id):
            raise CorruptEntity(
                f"{f.name}: entity {id_hex(record.id)} names codec dictionary {dict_id}, "
                "which neither the manifest nor the target datastore has"
            )
        yield record


def _jsonl(f: BinaryIO, ds: DataStore) -> Iterator[Record]:
    for n, line in enumerate(f, 1):
        try:
            item = from_json(line.decode())
            entity = item["entity"]
            key = to_id(entity["id"])
            record = Record(
                key, int(item["version"]), int(item["updated"]), ds.codec.encode(entity)
            )
        except (ValueError, TypeError, KeyError, SchemalessError) as exc:
            raise InvalidEntity(f"{f.name} line {n}: {exc}") from None
        yield record


def _write(ds: DataStore, records: list[Record]) -> None:
    """Upsert entity rows, keeping the larger version: one batch per server, servers in
    parallel (in parts that fit the servers' max_allowed_packet)."""
    topo = ds.cluster.current()
    for part in chunks(records, _record_bytes, ds.cluster.max_batch_bytes):
        groups = by_server(topo, part, lambda record: shard_of(record.id, topo.n_shards))
        ds.cluster.scatter(topo, groups, functools.partial(_upsert_sql, topo))


def _record_bytes(record: Record) -> int:
    return STATEMENT_BYTES + sql_bytes((record.id, record.body))


def _upsert_sql(topo: Topology, part: list[Record]) -> tuple[str, list[Any]]:
    """One server's upserts, a statement per logical shard, in one transaction (owned
    layout: rows name their shard, the guard refuses one not owned, the check ends it)."""
    groups: dict[int, list[Record]] = {}
    for record in part:
        groups.setdefault(shard_of(record.id, topo.n_shards), []).append(record)
    owned = topo.owned_db is not None  # rows carry their shard, through the guard
    cols, marks = ("`shard`, ", "%s, ") if owned else ("", "")
    stmts: list[str] = []
    params: list[Any] = []
    for shard, records in sorted(groups.items()):
        stmts.append(
            f"INSERT INTO {quote(topo.dbs[shard], 'entities')}"
            f" ({cols}`id`, `version`, `updated`, `body`) VALUES "
            + ", ".join([f"({marks}%s, %s, %s, %s)"] * len(records))
            + " ON DUPLICATE KEY UPDATE"  # the version last: the others compare the old one
            " `body` = IF(VALUES(`version`) > `version`, VALUES(`body`), `body`),"
            " `updated` = IF(VALUES(`version`) > `version`, VALUES(`updated`), `updated`),"
            " `version` = GREATEST(`version`, VALUES(`version`))"
        )
        for r in records:
            params += [shard] if owned else []
            params += [r.id, r.version, r.updated, r.body]
    return locked(stmts, topo.owned_db, groups), params


# -- module tables (schemaless.edges, schemaless.feeds) ---------------------------------

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
_OPTIONS = re.compile(r"\) ENGINE=InnoDB(?: (?:DEFAULT )?[A-Z_]+=[A-Za-z0-9_]+)*\Z")
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
        elif not found:
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


def _discover(
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


def _dump_tables(
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


def _dump_wide(
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
            while batch := cursor.fetchmany(_PAGE):
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


def _no_table_rows(ds: DataStore, topo: Topology, tables: list[TableDump]) -> None:
    """Refuse a target whose module tables of the dump hold rows: a restore never
    merges (an interrupted one is resumed by its checkpoints instead)."""
    db = str(topo.owned_db)
    for server in ds.cluster.all_servers(topo).values():
        have = sorted(table_names(server, db) & {t.name for t in tables})
        if have:
            got = server.run(admin([f"SELECT EXISTS (SELECT 1 FROM {quote(db, n)})" for n in have]))
            for name, result in zip(have, got, strict=True):
                if result[0][0]:
                    raise _not_empty(topo, f"rows in {name}")


def _check_table_files(src: Path, tables: list[TableDump]) -> None:
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


def _restore_tables(
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
    ds.cluster._on_dbs(
        topo,
        lambda db: [
            stmt
            for t in tables
            for stmt in [
                f"CREATE TABLE IF NOT EXISTS {quote(db, t.name)} {t.create.split(' ', 3)[3]}",
                *(guard_sql(db, t.name) if t.sharded else []),
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
            _restore_file(ds, f"{job}:{table.name}", shard, rows, write, position, progress)

    files = [(t, name) for t in tables for name in sorted(t.files)]
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="schemaless-restore") as pool:
        list(pool.map(one, files))


def _write_rows(ds: DataStore, table: TableDump, rows: list[tuple[Any, ...]]) -> None:
    """Rows of a sharded module table, each into the logical shard of its id (the key's
    column after ``shard``), through the guard: one transaction per server."""
    topo = ds.cluster.current()
    at = table.columns.index(table.key[1])

    def shard(row: tuple[Any, ...]) -> int:
        return shard_of(row[at], topo.n_shards)

    def build(part: list[tuple[Any, ...]]) -> tuple[str, list[Any]]:
        shards = {shard(r) for r in part}
        stmt = _insert_sql(str(topo.owned_db), table.name, ("shard", *table.columns), len(part))
        return locked([stmt], topo.owned_db, shards), [v for r in part for v in (shard(r), *r)]

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
