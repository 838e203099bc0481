"""Driver errors become schemaless errors here, and nowhere else.

:func:`translate` maps a MySQLdb error (by its code, and for the driver's own errors by
its text) to the ``SchemalessError`` a caller sees; the code sets tell the connection
pool what is safe to retry and when a server is suspect.
"""

from __future__ import annotations

import MySQLdb

from .errors import (
    ConflictError,
    EntityTooLarge,
    InvalidEntity,
    OutcomeUnknown,
    PermissionDenied,
    SchemalessError,
    ServerError,
    ShardTimeout,
    ShardUnavailable,
    StorageFull,
    TableMissing,
)

__all__ = ["DEADLOCK", "LOST", "NOT_SENT", "TIMED_OUT_HINTS", "error_code", "translate"]

DEADLOCK = {1205, 1213}  # lock wait timeout, deadlock: the server rolled back
# 1203, 1226: the user's connection (or hourly) limits, reached: retryable like 1040
UNREACHABLE = {1040, 1053, 1203, 1226, 1927, 2002, 2003, 2005, 2006, 2013, 2055, 4031}
NOT_SENT = {1040, 2002, 2003, 2005}  # failed before the batch could reach the server
# 1419: a trigger (the owned layout's guard) created without SUPER, binary logging on
# 1698: access denied to a user without a password (unix_socket authentication)
DENIED = {1044, 1045, 1142, 1143, 1227, 1370, 1419, 1698}
MISSING = {1049, 1146}
MOVED = 1452  # the owned layout's guard key: a new row of a logical shard not held here
TOO_LARGE = {1153, 1301, 2020}
BAD_VALUE = {1264, 1366, 1406, 1292}
FULL = {1021, 1114}  # disk full, table full (a data file at its cap)
FULL_HINTS = ("no space left", "errcode: 28", "errno: 28", "error 28 ")
TIMED_OUT_HINTS = ("timed out", "system error: 110", "timeout")
# Driver errors of a server that dropped a connection or refused one.
LOST = {1053, 2002, 2003, 2006, 2013, 2055}


def translate(name: str, exc: MySQLdb.Error, *, sent: bool, commits: bool) -> SchemalessError:
    """The one place where driver errors become schemaless errors."""
    code = error_code(exc)
    text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    where = f"{name}: {text} (MySQL error {code})"
    if code == 2026:
        return ShardUnavailable(
            f"TLS connection failed (check the ssl options and the server's certificate): {where}"
        )
    if code in UNREACHABLE or (isinstance(exc, MySQLdb.OperationalError) and code >= 2000):
        timed_out = any(h in text.lower() for h in TIMED_OUT_HINTS) or code == 2013
        if sent and commits and code in (2006, 2013):
            return OutcomeUnknown(f"commit outcome unknown, connection lost: {where}")
        if timed_out and code != 2006:
            return ShardTimeout(f"server did not answer in time: {where}")
        return ShardUnavailable(f"server unavailable: {where}")
    if code in DEADLOCK:
        return ShardUnavailable(f"lock contention persisted: {where}")
    if code == 1969:  # the server's max_statement_time: aborted, nothing committed
        return ShardTimeout(f"statement ran past the server's max_statement_time: {where}")
    if code == 1062:  # duplicate key (e.g. a NEW entity's id is taken): nothing written
        return ConflictError(f"duplicate key: {where}")
    if code in DENIED:
        hint = "" if code == 1045 else "; this user's grants do not allow it"
        return PermissionDenied(f"permission denied: {where}{hint}")
    if code == MOVED:
        return TableMissing(f"a logical shard named is not on this server (moved): {where}")
    if code in MISSING:
        return TableMissing(f"missing database or table (initialised? moving?): {where}")
    if code in FULL or any(h in text.lower() for h in FULL_HINTS):
        return StorageFull(f"server out of space, statement rolled back: {where}")
    if code in TOO_LARGE:
        return EntityTooLarge(f"statement too large for the server: {where}")
    if code in BAD_VALUE:
        return InvalidEntity(f"value refused by the server: {where}")
    if code == 1176:  # a key named by FORCE INDEX is not there
        return ServerError(
            f"a table lacks a key this version reads by (an owned datastore made by an"
            f" earlier unreleased build: dump it with that build, restore with this one): {where}"
        )
    return ServerError(f"server error: {where}")


def error_code(exc: MySQLdb.Error) -> int:
    arg = exc.args[0] if exc.args else 0
    return arg if isinstance(arg, int) else 0
