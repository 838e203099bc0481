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

The owned layout's module tables (``schemaless.edges``, ``schemaless.feeds``) are
dumped too, each shard's rows in that shard's snapshot (``schemaless.dumptables``).

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
entities, each row into the logical shard of its node; a target in the layout of a
database per shard refuses a dump with module tables.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import MySQLdb

from .catalog import IndexState, Topology
from .codec import Codec
from .dumpfiles import MANIFEST, PAGE, DumpError, Progress, not_empty, restore_file
from .dumptables import (
    TABLES,
    TableDump,
    check_table_files,
    discover,
    dump_tables,
    dump_wide,
    no_table_rows,
    restore_tables,
    table_dumps,
)
from .errors import CatalogError, CorruptEntity, InvalidEntity, SchemalessError
from .expiry import check_property
from .feed import enable_changes
from .hashing import shard_of
from .ids import id_hex, to_id
from .index import Index
from .jsonform import from_json, to_jsonable
from .names import quote
from .owned import check_sql, locked
from .scatter import STATEMENT_BYTES, added_page_sql, by_server, chunks, sql_bytes
from .store import DataStore
from .translate import translate

__all__ = [
    "ENCODINGS",
    "MANIFEST",
    "DumpError",
    "Record",
    "Settings",
    "TableDump",
    "dump",
    "dump_directory",
    "read_manifest",
    "restore",
    "table_dumps",
]

log = logging.getLogger(__name__)

ENCODINGS = ("jsonl", "native")
_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Record:
    """One entity as dumped: its id, version, ``updated`` (µs) and stored body."""

    id: bytes
    version: int
    updated: int
    body: bytes


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
    out = dump_directory(directory)
    topo = ds.cluster.refresh()
    if topo.moves:
        raise CatalogError("logical shards are being moved: dump once the moves have finished")
    indexes = [
        info.index.to_dict() for info in topo.indexes.values() if info.state != IndexState.DROPPED
    ]
    tables, present = discover(ds, topo, out)
    rows: dict[str, dict[str, int]] = {name: {} for name in tables}

    def one(shard: int) -> tuple[int, set[int]]:
        here = present.get(topo.shard_servers[shard], set())
        mine = [t for name, t in sorted(tables.items()) if t.sharded and name in here]
        then = functools.partial(dump_tables, topo, shard, mine, out, encoding, rows)
        return _dump_shard(ds, topo, shard, out / f"shard-{shard:04d}.{encoding}", progress, then)

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="schemaless-dump") as pool:
        results = list(pool.map(one, range(topo.n_shards)))
    dump_wide(ds, topo, [t for t in tables.values() if not t.sharded], present, out, encoding, rows)
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
    sql = added_page_sql(topo, shard, "`added_id`, `id`, `version`, `updated`, `body`", PAGE)
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
                if len(rows) < PAGE:
                    break
                after = rows[-1][0]
            if then is not None:
                then(db)
            cursor.execute("COMMIT")
        except MySQLdb.Error as exc:
            where = f"{server.name}: dumping logical shard {shard}"
            raise translate(where, exc, sent=True, commits=False) from exc
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


def dump_directory(directory: str | Path) -> Path:
    """``directory``, made if missing, for a new dump: ``DumpError`` if it holds one
    already or cannot be made."""
    out = Path(directory)
    if (out / MANIFEST).exists() or any(out.glob("shard-*")) or (out / TABLES).exists():
        raise DumpError(f"{out} already holds a dump: choose an empty directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DumpError(f"cannot make the dump directory {out}: {exc.strerror}") from exc
    return out


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
        no_table_rows(ds, topo, tables)
    check_table_files(src, tables)  # a bad table file: refused before anything is written
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
            restore_file(ds, job, shard, records, write, position, progress)

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="schemaless-restore") as pool:
        list(pool.map(one, sorted(manifest["files"])))
    restore_tables(ds, topo, src, job, tables, workers, progress)
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
            raise not_empty(topo, f"index {name!r}, which this dump does not define")
        if sum(d for _, d, _ in done.values()) < files:
            raise not_empty(topo, f"index {name!r} but no finished restore of this dump")
    if not done and not ds._empty(topo):
        raise not_empty(topo, "entities")
    return done


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
