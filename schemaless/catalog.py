"""The catalog: cluster map, index definitions and states, checkpoints, dictionaries.

One database (``<prefix>_catalog``) on the first server.  Clients load it in one
round trip (``Catalog.load``) and refresh it on an interval; everything that must
survive a restart of any process (index states, Cleaner checkpoints and heartbeats,
codec dictionaries) lives here.

``Catalog`` is the one object the rest of the code talks to.  This module creates
and loads the catalog and keeps the datastore's settings in ``meta``; each other
concern is a part of it in its own module, over ``catalogdb.CatalogDB``:
``shardmap`` (servers, moves, replicas), ``indexstates`` (the index lifecycle),
``checkpoints`` (the Cleaner's jobs), ``heartbeats`` (daemons and clients alive) and
``dictionaries`` (the codec's); the snapshot's values are in ``topology``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .catalogdb import backfill_job, now_us, sweep_job, unfit_job, unique_job
from .checkpoints import Checkpoints
from .dictionaries import Dictionaries
from .dsn import Address
from .errors import CatalogError
from .expiry import META_NAME as EXPIRE_ON
from .heartbeats import ClientReport, Heartbeats
from .index import Index
from .indexstates import IndexStates
from .names import quote
from .owned import DATABASES, LAYOUTS, OWNED, placement
from .results import scalar
from .schema import CATALOG_TABLES
from .shardmap import ShardMap
from .topology import IndexInfo, IndexState, Topology

__all__ = [
    "Catalog",
    "ClientReport",
    "IndexInfo",
    "IndexState",
    "Topology",
    "backfill_job",
    "now_us",
    "sweep_job",
    "unfit_job",
    "unique_job",
]

FORMAT = "1"


class Catalog(ShardMap, IndexStates, Checkpoints, Heartbeats, Dictionaries):
    """Reads and changes the catalog database through its server."""

    # -- creation -----------------------------------------------------------------------

    def exists(self) -> bool:
        """Whether this server holds an initialised catalog for the prefix."""
        rows = self.server.run(
            "SELECT COUNT(*) FROM information_schema.tables"
            " WHERE table_schema = %s AND table_name = 'meta'",
            (self.db,),
        )
        if not scalar(rows[0]):
            return False
        return bool(self.server.run(f"SELECT 1 FROM {self._t('meta')} WHERE name = 'shards'")[0])

    def ensure_tables(self) -> None:
        """Create the catalog database and any table it lacks (an upgrade is this)."""
        ddl = [f"CREATE DATABASE IF NOT EXISTS {quote(self.db)}"]
        ddl += [
            f"CREATE TABLE IF NOT EXISTS {self._t(name)} ({cols}) ENGINE=InnoDB"
            for name, cols in CATALOG_TABLES.items()
        ]
        self.server.run(";\n".join(ddl))

    def create(
        self,
        addresses: Sequence[Address],
        n_shards: int,
        refresh_interval: float,
        layout: str = OWNED,
    ) -> bool:
        """Create the catalog and the shard map if absent; True if this call created it.

        Safe to run concurrently: the first writer of the map wins, the others find it.
        """
        if not 1 <= n_shards <= 65536:
            raise CatalogError(f"number of logical shards must be 1..65536, got {n_shards}")
        if layout not in LAYOUTS:
            raise CatalogError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if not addresses:
            raise CatalogError("a datastore needs at least one server")
        self.ensure_tables()
        stmts = ["START TRANSACTION"]
        params: list[Any] = []
        stmts.append(
            f"INSERT IGNORE INTO {self._t('meta')} (name, value) VALUES"
            " ('format', %s), ('shards', %s), ('map_version', '1'), ('refresh_interval', %s),"
            " ('index_epoch', '1'), ('layout', %s)"
        )
        params += [FORMAT, str(n_shards), repr(float(refresh_interval)), layout]
        # Only the writer whose meta rows went in writes the map: a racing creator with
        # another shard count or server list must not add its rows to the winner's.
        stmts.append("SET @created := ROW_COUNT() = 6")
        stmts.append("SELECT @created")
        for table, cols, rows in (
            (
                "servers",
                "server_id, host, port",
                [(i, a.host, a.port) for i, a in enumerate(addresses)],
            ),
            (
                "shards",
                "shard, server_id",
                list(enumerate(placement(n_shards, len(addresses), layout))),
            ),
        ):
            marks = ", ".join(["(" + ", ".join(["%s"] * len(rows[0])) + ")"] * len(rows))
            stmts.append(
                f"INSERT IGNORE INTO {self._t(table)} ({cols}) WITH v ({cols}) AS"
                f" (VALUES {marks}) SELECT {cols} FROM v WHERE @created"
            )
            params += [value for row in rows for value in row]
        stmts.append("COMMIT")
        out = self.server.run(";\n".join(stmts), params, commits=True)
        return bool(scalar(out[0]) == 1)

    def start_epochs(self) -> None:
        """Give a catalog from before fences its first index epoch (its shards' fence
        tables must exist first); one that has an epoch keeps it."""
        self.server.run(
            f"INSERT IGNORE INTO {self._t('meta')} (name, value) VALUES ('index_epoch', '1')"
        )

    # -- reading ------------------------------------------------------------------------

    def load(self) -> Topology:
        """Read the whole catalog in one round trip, as one consistent snapshot (the
        session's READ COMMITTED would let each statement see a different moment, e.g.
        the map version before a shard move's flip and the move list after it)."""
        out = self.server.run(
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ;"
            " START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY;"
            f" SELECT name, value FROM {self._t('meta')};"
            f" SELECT server_id, host, port FROM {self._t('servers')} ORDER BY server_id;"
            f" SELECT shard, server_id FROM {self._t('shards')} ORDER BY shard;"
            f" SELECT definition, state, created, changed FROM {self._t('indexes')};"
            f" SELECT dict_id FROM {self._t('dictionaries')} ORDER BY dict_id;"
            f" SELECT shard, source, target, phase FROM {self._t('moves')};"
            f" SELECT server_id, host, port FROM {self._t('replicas')} ORDER BY host, port;"
            " COMMIT"
        )
        meta = {str(k): str(v) for k, v in out[0]}
        if "shards" not in meta:
            raise CatalogError(f"no datastore {self.prefix!r} on {self.server.name}: run init")
        if meta.get("format") != FORMAT:
            raise CatalogError(f"catalog format {meta.get('format')!r} is not supported")
        n_shards = int(meta["shards"])
        shard_servers = tuple(int(sid) for _, sid in out[2])
        if len(shard_servers) != n_shards:
            raise CatalogError(f"catalog maps {len(shard_servers)} of {n_shards} shards")
        indexes = {}
        for definition, state, created, changed in out[3]:
            index = Index.from_dict(json.loads(definition))
            indexes[index.name] = IndexInfo(index, IndexState(state), int(created), int(changed))
        active = meta.get("active_dictionary")
        return Topology(
            prefix=self.prefix,
            n_shards=n_shards,
            map_version=int(meta["map_version"]),
            refresh_interval=float(meta.get("refresh_interval", "5.0")),
            servers={int(sid): Address(str(h), int(p)) for sid, h, p in out[1]},
            shard_servers=shard_servers,
            indexes=indexes,
            dictionary_ids=tuple(int(r[0]) for r in out[4]),
            active_dictionary=int(active) if active else None,
            moves={int(r[0]): (int(r[1]), int(r[2]), str(r[3])) for r in out[5]},
            replicas=_group_replicas(out[6]),
            index_epoch=int(meta.get("index_epoch", "0")),
            expire_on=meta.get(EXPIRE_ON) or None,
            changes=meta.get("changes") == "1",
            layout=meta.get("layout", DATABASES),
        )

    # -- settings -----------------------------------------------------------------------

    def set_expire_on(self, prop: str | None, *, replace: bool) -> None:
        """Record the expiry property (None: entities never expire); without
        ``replace``, only if the datastore has none yet."""
        if prop is None:
            sql = f"DELETE FROM {self._t('meta')} WHERE name = %s"
            self.server.run(sql, (EXPIRE_ON,))
            return
        verb = "REPLACE" if replace else "INSERT IGNORE"
        self.server.run(
            f"{verb} INTO {self._t('meta')} (name, value) VALUES (%s, %s)", (EXPIRE_ON, prop)
        )

    def enable_changes(self, epoch: int) -> bool:
        """Turn the change feed on and move the index epoch on from ``epoch`` (whose
        successor's fences the caller created), so that writers with an older map fail
        and refresh; False if the epoch is no longer ``epoch``."""
        meta = self._t("meta")
        out = self.server.run(
            f"START TRANSACTION; {self._lock_map};"
            f" UPDATE {meta} SET value = value + 1 WHERE name = 'index_epoch' AND value = %s;"
            " SET @moved = ROW_COUNT();"
            f" INSERT INTO {meta} (name, value) SELECT 'changes', '1' FROM DUAL WHERE @moved > 0"
            " ON DUPLICATE KEY UPDATE value = '1'; SELECT @moved; COMMIT",
            (str(epoch),),
            commits=True,
        )
        return bool(out[1][0][0])


def _group_replicas(rows: Sequence[Sequence[Any]]) -> dict[int, tuple[Address, ...]]:
    out: dict[int, list[Address]] = {}
    for sid, host, port in rows:
        out.setdefault(int(sid), []).append(Address(str(host), int(port)))
    return {sid: tuple(addrs) for sid, addrs in out.items()}
