"""Invites on PostgreSQL: the ``invites`` table (``schema/0003_invites.sql``), with the rules of
``syncd/hub/invites.py``. A redeem is one transaction: the invite's row is locked ``FOR
UPDATE``, checked, marked used, and its token inserted; a name an active token holds rolls the
whole transaction back, so the invite stays unused."""

from __future__ import annotations

import asyncpg

from syncd.hub.invites import (
    Invite,
    Redeemed,
    check_new_invite,
    check_redeemable,
    invite_row,
    name_taken,
    new_invite_id,
    new_secret,
    secret_hash,
    state,
)
from syncd.hub.pg.tokens import Connect
from syncd.hub.tokens import new_raw_token, now_text, token_hash

_COLUMNS = ("id", "name", "role", "plan", "secret_sha256", "created_at", "expires_at", "used_at",
            "revoked_at")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM invites"


def _invite(row: asyncpg.Record | None) -> Invite | None:
    return None if row is None else Invite(**dict(zip(_COLUMNS, row, strict=True)))


class PgInvites:
    def __init__(self, connect: Connect) -> None:
        self._connect = connect

    async def create(self, *, name: str, role: str, plan: str, expires_at: str) -> tuple[str, str]:
        check_new_invite(name=name, role=role, plan=plan)
        invite_id, secret, now = new_invite_id(), new_secret(), now_text()
        async with self._connect() as conn, conn.transaction():
            if await conn.fetchval("SELECT 1 FROM tokens WHERE name = $1 AND revoked_at IS NULL",
                                   name):
                raise ValueError(f"name: an active token is already named {name!r}")
            if await conn.fetchval("SELECT 1 FROM invites WHERE name = $1 AND used_at IS NULL "
                                   "AND revoked_at IS NULL AND expires_at > $2", name, now):
                raise ValueError(f"name: a pending invite is already named {name!r} (`syncd "
                                 "hub invite --list` shows it; `--revoke ID` ends it)")
            await conn.execute("INSERT INTO invites (id, secret_sha256, name, role, plan, "
                               "created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                               invite_id, secret_hash(secret), name, role, plan, now, expires_at)
        return invite_id, secret

    async def list(self) -> list[dict[str, str | None]]:
        async with self._connect() as conn:
            rows = await conn.fetch(f"{_SELECT} ORDER BY created_at, id")
        now = now_text()
        return [invite_row(i, now) for r in rows if (i := _invite(r)) is not None]

    async def revoke(self, invite_id: str, *, now: str) -> Invite | None:
        async with self._connect() as conn, conn.transaction():
            found = _invite(await conn.fetchrow(f"{_SELECT} WHERE id = $1 FOR UPDATE",
                                                invite_id))
            if found is not None and state(found, now) in ("pending", "expired"):
                await conn.execute("UPDATE invites SET revoked_at = $2 WHERE id = $1",
                                   invite_id, now)
        return found

    async def redeem(self, invite_id: str, secret: str, *, now: str) -> Redeemed:
        async with self._connect() as conn, conn.transaction():
            invite = check_redeemable(_invite(await conn.fetchrow(
                f"{_SELECT} WHERE id = $1 FOR UPDATE", invite_id)), secret, now)
            await conn.execute("UPDATE invites SET used_at = $2 WHERE id = $1", invite_id, now)
            raw = new_raw_token()
            try:
                await conn.execute("INSERT INTO tokens (sha256, name, role, plan, created_at) "
                                   "VALUES ($1, $2, $3, $4, $5)", token_hash(raw), invite.name,
                                   invite.role, invite.plan, now)
            except asyncpg.UniqueViolationError:
                raise name_taken(invite.name) from None
        return Redeemed(name=invite.name, role=invite.role, plan=invite.plan, token=raw)
