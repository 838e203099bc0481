"""The codec's trained dictionaries in the catalog (``schemaless.codec``).

Ids are never reused, so a body compressed with any dictionary can always be read;
the active one (``meta.active_dictionary``) is what new bodies are written with.
"""

from __future__ import annotations

from .catalogdb import CatalogDB, now_us
from .errors import CatalogError
from .results import one, scalar

__all__ = ["Dictionaries"]


class Dictionaries(CatalogDB):
    """The catalog's ``dictionaries`` table."""

    def dictionary(self, dict_id: int) -> bytes:
        """The data of one codec dictionary."""
        out = self.server.run(
            f"SELECT data FROM {self._t('dictionaries')} WHERE dict_id = %s", (dict_id,)
        )
        row = one(out[0])
        if row is None:
            raise CatalogError(f"codec dictionary {dict_id} is not in the catalog")
        return bytes(row[0])

    def add_dictionary(self, data: bytes, *, activate: bool = True) -> int:
        """Store a trained dictionary (ids are never reused) and make it the active one."""
        out = self.server.run(
            "START TRANSACTION;"
            f" SELECT COALESCE(MAX(dict_id), 0) + 1 INTO @next FROM {self._t('dictionaries')}"
            " FOR UPDATE;"
            f" INSERT INTO {self._t('dictionaries')} (dict_id, data, created)"
            " VALUES (@next, %s, %s);"
            + (
                f" REPLACE INTO {self._t('meta')} (name, value)"
                " VALUES ('active_dictionary', @next);"
                if activate
                else ""
            )
            + " SELECT @next; COMMIT",
            (data, now_us()),
            commits=True,
            idempotent=False,
        )
        return int(scalar(out[0]))
