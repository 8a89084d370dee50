"""The client's version and the extension versions it supports."""
from __future__ import annotations

from typing import Optional

import psycopg

__version__ = "0.4.0"

#: The versions of the pg_throttle extension this client works with.
SUPPORTED = ("0.4.0",)

QUERY = "SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle'"


class VersionError(RuntimeError):
    """The database has no pg_throttle extension, or a version this client
    does not support. `found` is the extension's version (None when it is not
    installed), `database` the database's name."""

    def __init__(self, found: Optional[str], database: str):
        self.found, self.database, self.supported = found, database, SUPPORTED
        if found is None:
            message = (f"the pg_throttle extension is not installed in database {database!r}: "
                       f"run CREATE EXTENSION pg_throttle there (pg_throttle client {__version__} "
                       f"supports extension version {', '.join(SUPPORTED)})")
        else:
            message = (f"database {database!r} has pg_throttle {found}, but pg_throttle client "
                       f"{__version__} supports extension version {', '.join(SUPPORTED)}: "
                       f"install a client that matches (or ALTER EXTENSION pg_throttle UPDATE)")
        super().__init__(message)


def _verdict(row, database: str) -> str:
    found = row[0] if row else None
    if found not in SUPPORTED:
        raise VersionError(found, database)
    return found


def check_version(conn: psycopg.Connection) -> str:
    """Returns the extension's version in the connection's database, or raises
    VersionError when it is not installed there or not one of SUPPORTED."""
    row = conn.execute(QUERY).fetchone()
    return _verdict(row, conn.info.dbname)


async def check_version_async(conn: psycopg.AsyncConnection) -> str:
    """check_version for an AsyncConnection."""
    cur = await conn.execute(QUERY)
    return _verdict(await cur.fetchone(), conn.info.dbname)
