"""Changes to the shard map: servers added, shard moves recorded and flipped, read
replicas.

Every change that sends a logical shard elsewhere bumps ``meta.map_version`` in the
same transaction, so clients see it on their next refresh.  The online move itself
is ``schemaless.move``.
"""

from __future__ import annotations

from collections.abc import Iterable

from .catalogdb import CatalogDB, now_us
from .dsn import Address
from .errors import CatalogError
from .results import scalar

__all__ = ["ShardMap"]


class ShardMap(CatalogDB):
    """The catalog's ``servers``, ``shards``, ``moves`` and ``replicas`` tables."""

    def add_server(self, address: Address) -> int:
        """Register a server (it holds no shard until one moves there); return its id."""
        out = self.server.run(
            "START TRANSACTION;"
            f" SELECT COALESCE(MAX(server_id), -1) + 1 INTO @sid FROM {self._t('servers')}"
            " FOR UPDATE;"
            f" INSERT IGNORE INTO {self._t('servers')} (server_id, host, port)"
            " VALUES (@sid, %s, %s);"
            f" SELECT server_id FROM {self._t('servers')} WHERE host = %s AND port = %s;"
            f" UPDATE {self._t('meta')} SET value = value + 1 WHERE name = 'map_version';"
            " COMMIT",
            (address.host, address.port, address.host, address.port),
            commits=True,
            idempotent=False,
        )
        return int(scalar(out[0]))

    def record_move(self, shard: int, source: int, target: int, phase: str) -> None:
        """Create or advance the record of a shard move."""
        now = now_us()
        self.server.run(
            f"INSERT INTO {self._t('moves')} (shard, source, target, phase, started, updated)"
            " VALUES (%s, %s, %s, %s, %s, %s)"
            " ON DUPLICATE KEY UPDATE phase = VALUES(phase), updated = VALUES(updated)",
            (shard, source, target, phase, now, now),
        )

    def finish_move(self, shard: int, target: int, indexes: Iterable[str], epoch: int) -> int:
        """Point a logical shard at its new server, bump the map version, forget the
        move record (one transaction); return the new map version.

        Only if the catalog still lists exactly the ``indexes`` the move copied, at the
        index ``epoch`` whose fence it copied (an index is recorded under the same
        lock, so none is declared meanwhile); otherwise nothing changes and a
        ``CatalogError`` names the difference."""
        copied = ",".join(sorted(indexes)) + f"@{int(epoch)}"
        out = self.server.run(
            f"START TRANSACTION; {self._lock_map};"
            " SELECT @names := CONCAT(COALESCE(GROUP_CONCAT(name ORDER BY name SEPARATOR ','),"
            f" ''), '@', COALESCE((SELECT value FROM {self._t('meta')}"
            f" WHERE name = 'index_epoch'), '0')) FROM {self._t('indexes')};"
            f" UPDATE {self._t('shards')} SET server_id = %s WHERE shard = %s AND @names = %s;"
            f" UPDATE {self._t('meta')} SET value = value + 1"
            " WHERE name = 'map_version' AND @names = %s;"
            f" DELETE FROM {self._t('moves')} WHERE shard = %s AND @names = %s;"
            f" SELECT value FROM {self._t('meta')} WHERE name = 'map_version';"
            " COMMIT",
            (target, shard, copied, copied, shard, copied),
            commits=True,
            idempotent=False,
        )
        names = scalar(out[1])
        if names != copied:
            now = str(names).replace("@", " at index epoch ")
            raise CatalogError(
                f"the indexes changed during the move of shard {shard} (now: {now}; "
                f"copied: {copied.replace('@', ' at index epoch ')}): move it again"
            )
        return int(scalar(out[-1]))

    def cancel_move(self, shard: int) -> None:
        """Forget a move that was rolled back."""
        self.server.run(f"DELETE FROM {self._t('moves')} WHERE shard = %s", (shard,))

    def add_replica(self, server_id: int, address: Address) -> None:
        """Record a read replica of a server (replication is set up by the operator)."""
        self.server.run(
            f"INSERT IGNORE INTO {self._t('replicas')} (server_id, host, port) VALUES (%s, %s, %s)",
            (server_id, address.host, address.port),
        )

    def remove_replica(self, server_id: int, address: Address) -> bool:
        """Stop sending reads to a replica; False if it was none of that server's."""
        counts: list[int] = []
        self.server.run(
            f"DELETE FROM {self._t('replicas')} WHERE server_id = %s AND host = %s AND port = %s",
            (server_id, address.host, address.port),
            counts=counts,
        )
        return counts[0] > 0
