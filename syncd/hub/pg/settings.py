"""The PostgreSQL hub's small state, as rows every process reads when it needs them: the
memory settings, the named counters, the entitlement signing key and the web page's sessions."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store import ValidationError
from local_store.arguments import msgspec_field
from local_store.redact import strip_json_object
from protocol.settings import DEFAULT_SETTINGS, MemorySettings, load_settings, merge_patch
from syncd.hub.keys import key_from_pem, new_key_pem
from syncd.hub.pg.tokens import Connect
from syncd.hub.store import PageSession


class PgState:
    """Settings, counters, the signing key and page sessions."""

    def __init__(self, connect: Connect) -> None:
        self._connection = connect

    async def next_counter(self, name: str) -> int:
        async with self._connection() as conn:
            value = await conn.fetchval(
                "INSERT INTO counters (name, value) VALUES ($1, 1) ON CONFLICT (name) "
                "DO UPDATE SET value = counters.value + 1 RETURNING value", name)
        return int(value)

    async def settings(self) -> MemorySettings:
        async with self._connection() as conn:
            raw = await conn.fetchval("SELECT value FROM settings WHERE id = 1")
        return DEFAULT_SETTINGS if raw is None else load_settings(raw)[0]

    async def put_settings(self, patch: Mapping[str, object]) -> MemorySettings:
        """Read-merge-write under the row lock, so two processes' patches both land."""
        async with self._connection() as conn, conn.transaction():
            await conn.execute("INSERT INTO settings (id, value) VALUES (1, $1) "
                               "ON CONFLICT (id) DO NOTHING",
                               msgspec.json.encode(DEFAULT_SETTINGS).decode())
            raw = await conn.fetchval("SELECT value FROM settings WHERE id = 1 FOR UPDATE")
            try:
                merged = merge_patch(load_settings(raw)[0], strip_json_object(patch))
            except msgspec.ValidationError as exc:
                raise ValidationError(msgspec_field(str(exc)), str(exc)) from None
            await conn.execute("UPDATE settings SET value = $1 WHERE id = 1",
                               msgspec.json.encode(merged).decode())
        return merged

    async def signing_key(self) -> Ed25519PrivateKey:
        """The hub's entitlement key: the first process to ask creates it, all share it."""
        async with self._connection() as conn:
            await conn.execute("INSERT INTO signing_keys (name, pem) VALUES ('entitlement', $1) "
                               "ON CONFLICT (name) DO NOTHING", new_key_pem().decode())
            stored = await conn.fetchval("SELECT pem FROM signing_keys WHERE name = 'entitlement'")
        return key_from_pem(stored.encode(), "signing_keys.entitlement")

    # ------------------------------------------------------------------ page sessions

    async def add_page_session(self, sid_sha256: str, session: PageSession, *, now_ns: int,
                               keep: int) -> None:
        """The sweep first, on its own: it skips rows another process holds (that process is
        deleting them), so it never waits and never deadlocks. Then one transaction holding the
        token's row: sign-ins with one token through several processes take turns, so none
        leaves the token over ``keep``."""
        token = session.token_sha256
        async with self._connection() as conn:
            await conn.execute("DELETE FROM page_sessions WHERE sid_sha256 IN (SELECT sid_sha256 "
                               "FROM page_sessions WHERE expires_ns <= $1 FOR UPDATE SKIP LOCKED)",
                               now_ns)
            async with conn.transaction():
                await conn.execute("SELECT 1 FROM tokens WHERE sha256 = $1 FOR UPDATE", token)
                await conn.execute("INSERT INTO page_sessions (sid_sha256, token_sha256, csrf, "
                                   "expires_ns) VALUES ($1, $2, $3, $4)", sid_sha256, token,
                                   session.csrf, session.expires_ns)
                await conn.execute("DELETE FROM page_sessions WHERE token_sha256 = $1 AND seq < "
                                   "(SELECT min(seq) FROM (SELECT seq FROM page_sessions WHERE "
                                   "token_sha256 = $1 ORDER BY seq DESC LIMIT $2) AS newest)",
                                   token, keep)

    async def page_session(self, sid_sha256: str, *, now_ns: int) -> PageSession | None:
        async with self._connection() as conn:
            row = await conn.fetchrow("SELECT token_sha256, csrf, expires_ns FROM page_sessions "
                                      "WHERE sid_sha256 = $1 AND expires_ns > $2",
                                      sid_sha256, now_ns)
        return None if row is None else PageSession(token_sha256=row[0], csrf=row[1],
                                                    expires_ns=int(row[2]))

    async def end_page_session(self, sid_sha256: str) -> None:
        async with self._connection() as conn:
            await conn.execute("DELETE FROM page_sessions WHERE sid_sha256 = $1", sid_sha256)
