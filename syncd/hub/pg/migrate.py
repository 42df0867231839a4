"""Numbered schema migrations for the PostgreSQL hub: ``schema/NNNN_name.sql``, applied in
order, each in its own transaction, recorded in ``hub_schema``. Several hub processes may start
at once: a session advisory lock lets one migrate while the others wait, then find nothing to do.
A database migrated by a newer syncd (a version this one does not know) is refused."""

from __future__ import annotations

import asyncio
import re
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Conn = PoolConnectionProxy[Any]
else:
    Conn = Any  # a pooled asyncpg connection

MIGRATE_LOCK = (7365726, 0)
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


class SchemaError(RuntimeError):
    pass


def migrations() -> list[tuple[int, str, str]]:
    """``(version, filename, sql)`` in order."""
    found = []
    for entry in resources.files("syncd.hub.pg").joinpath("schema").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    return found


async def migrate(conn: Conn) -> int:
    """Bring the schema up to date; returns the version it is at."""
    await conn.execute("SELECT pg_advisory_lock($1, $2)", *MIGRATE_LOCK)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS hub_schema ("
                           "version integer PRIMARY KEY, name text NOT NULL, "
                           "applied_at timestamptz NOT NULL DEFAULT now())")
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM hub_schema")
        known = await asyncio.to_thread(migrations)
        if known and current > known[-1][0]:
            raise SchemaError(f"the database's schema is version {current}, newer than this "
                              f"syncd knows ({known[-1][0]}): upgrade syncd")
        for version, name, sql in known:
            if version <= current:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO hub_schema (version, name) VALUES ($1, $2)",
                                   version, name)
            current = version
        return int(current)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1, $2)", *MIGRATE_LOCK)
