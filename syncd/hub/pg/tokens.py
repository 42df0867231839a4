"""Hub API tokens on PostgreSQL: the ``tokens`` table, by SHA-256 of the raw token (the same
rules as ``hub-tokens.json``, ``syncd/hub/tokens.py``). Every request reads the table, so a
token created or revoked through any process counts in every process at once."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import asyncpg

from syncd.hub.pg.migrate import Conn
from syncd.hub.tokens import (
    bearer,
    check_new_token,
    check_role,
    new_raw_token,
    now_text,
    token_hash,
)

Connect = Callable[[], AbstractAsyncContextManager[Conn]]


class PgTokens:
    def __init__(self, connect: Connect) -> None:
        self._connect = connect

    async def _active(self, raw: str) -> asyncpg.Record | None:
        return await self._active_hash(token_hash(raw))

    async def _active_hash(self, sha256: str) -> asyncpg.Record | None:
        async with self._connect() as conn:
            return await conn.fetchrow("SELECT name, role, plan FROM tokens WHERE sha256 = $1 "
                                       "AND revoked_at IS NULL", sha256)

    async def authenticate(self, header: str | None, need: str) -> tuple[str, str]:
        row = await self._active(bearer(header))
        return check_role(None if row is None else (row[0], row[1]), need)

    async def identify(self, raw: str) -> tuple[str, str] | None:
        row = await self._active(raw)
        return None if row is None else (row[0], row[2])

    async def lookup_hash(self, sha256: str) -> tuple[str, str, str] | None:
        row = await self._active_hash(sha256)
        return None if row is None else (row[0], row[1], row[2])

    async def create(self, *, role: str, name: str, plan: str = "pro") -> str:
        check_new_token(role=role, name=name, plan=plan)
        raw = new_raw_token()
        async with self._connect() as conn:
            try:
                await conn.execute("INSERT INTO tokens (sha256, name, role, plan, created_at) "
                                   "VALUES ($1, $2, $3, $4, $5)", token_hash(raw), name, role,
                                   plan, now_text())
            except asyncpg.UniqueViolationError:
                raise ValueError(f"name: an active token is already named {name!r}") from None
        return raw

    async def revoke(self, name: str) -> bool:
        async with self._connect() as conn:
            status = await conn.execute("UPDATE tokens SET revoked_at = $2 WHERE name = $1 "
                                        "AND revoked_at IS NULL", name, now_text())
        return status != "UPDATE 0"

    async def list(self) -> list[dict[str, str | None]]:
        async with self._connect() as conn:
            rows = await conn.fetch("SELECT name, role, plan, created_at, revoked_at FROM tokens "
                                    "ORDER BY created_at, name")
        return [dict(zip(("name", "role", "plan", "created_at", "revoked_at"), r, strict=True))
                for r in rows]
