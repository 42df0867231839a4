"""Invites on the hub (``syncd/hub/invites.py``): created by ``syncd hub invite``, redeemed once
at ``POST /v1/invites/redeem`` for a normal token — on both stores (SQLite and PostgreSQL),
through a real hub app on a loopback port."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from syncd.entitlement.token import public_key_text
from syncd.hub.admin import invite_main
from syncd.hub.app import INVITE_ATTEMPTS, create_hub_app
from syncd.hub.invites import (
    INVITES_FILENAME,
    Attempts,
    InviteText,
    MalformedInvite,
    invite_text,
    parse_invite,
    parse_lifetime,
)
from syncd.hub.store import HubStore
from syncd.hub.tokens import TOKENS_FILENAME, create_token

FUTURE, PAST = "2099-01-01T00:00:00Z", "2000-01-01T00:00:00Z"


@dataclass
class Served:
    url: str
    hub: HubStore
    app: web.Application
    public_key: str


@pytest.fixture
async def served(hub_store: HubStore) -> AsyncIterator[Served]:
    """A hub app over the parametrized store (SQLite, PostgreSQL), issuing entitlements."""
    key = await hub_store.signing_key()
    app = create_hub_app(hub_store, signing_key=key)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Served(f"http://127.0.0.1:{runner.addresses[0][1]}", hub_store, app,
                     public_key_text(key.public_key()))
    finally:
        await runner.cleanup()


async def redeem(served: Served, body: object) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(
            served.url + "/v1/invites/redeem", data=json.dumps(body),
            headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json(content_type=None)


async def status_with(served: Served, token: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(
            served.url + "/v1/agent/status", headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status


async def test_an_invite_becomes_a_working_token_once(served: Served) -> None:
    invite_id, secret = await served.hub.invites.create(name="alice-laptop", role="write",
                                                        plan="sync", expires_at=FUTURE)
    status, body = await redeem(served, {"id": invite_id, "secret": secret})
    assert status == 200, body
    assert (body["name"], body["role"], body["plan"]) == ("alice-laptop", "write", "sync")
    assert body["public_key"] == served.public_key
    token = body["token"]
    assert await status_with(served, token) == 200
    assert await served.hub.tokens.authenticate(f"Bearer {token}", "write") == (
        "alice-laptop", "write")
    status, again = await redeem(served, {"id": invite_id, "secret": secret})
    assert status == 410 and again["error"]["code"] == "invite_used", again
    assert "already used" in again["error"]["message"]
    (row,) = await served.hub.invites.list()
    assert row["state"] == "used" and row["used_at"] is not None
    assert secret not in repr(row)
    assert [t["name"] for t in await served.hub.tokens.list()] == ["alice-laptop"]


async def test_a_wrong_secret_and_an_unknown_id_get_the_same_answer(served: Served) -> None:
    """Only a caller holding the secret learns anything about the invite (rule 2); a wrong
    secret does not spend it."""
    invite_id, secret = await served.hub.invites.create(name="b", role="read", plan="pro",
                                                        expires_at=FUTURE)
    wrong = await redeem(served, {"id": invite_id, "secret": "x" * 43})
    unknown = await redeem(served, {"id": "0" * 12, "secret": secret})
    assert wrong == unknown
    assert wrong[0] == 401 and wrong[1]["error"]["code"] == "invite_unknown"
    assert (await served.hub.invites.list())[0]["state"] == "pending"
    status, body = await redeem(served, {"id": invite_id, "secret": secret})
    assert status == 200 and body["role"] == "read"


async def test_an_expired_invite_is_refused_and_grants_nothing(served: Served) -> None:
    invite_id, secret = await served.hub.invites.create(name="late", role="write", plan="pro",
                                                        expires_at=PAST)
    status, body = await redeem(served, {"id": invite_id, "secret": secret})
    assert status == 410 and body["error"]["code"] == "invite_expired", body
    assert PAST in body["error"]["message"]
    assert await served.hub.tokens.list() == []
    assert (await served.hub.invites.list())[0]["state"] == "expired"


async def test_a_revoked_invite_is_refused(served: Served) -> None:
    invites = served.hub.invites
    invite_id, secret = await invites.create(name="gone", role="write", plan="pro",
                                             expires_at=FUTURE)
    before = await invites.revoke(invite_id, now="2026-01-01T00:00:00Z")
    assert before is not None and before.revoked_at is None
    status, body = await redeem(served, {"id": invite_id, "secret": secret})
    assert status == 410 and body["error"]["code"] == "invite_revoked", body
    assert await served.hub.tokens.list() == []
    assert await invites.revoke("f" * 12, now="2026-01-01T00:00:00Z") is None
    again = await invites.revoke(invite_id, now="2026-01-02T00:00:00Z")
    assert again is not None and again.revoked_at == "2026-01-01T00:00:00Z"  # unchanged


async def test_a_name_taken_since_refuses_the_redeem_and_keeps_the_invite(
        served: Served) -> None:
    invites, tokens = served.hub.invites, served.hub.tokens
    invite_id, secret = await invites.create(name="dup", role="write", plan="pro",
                                             expires_at=FUTURE)
    with pytest.raises(ValueError, match=r"^name: a pending invite"):
        await invites.create(name="dup", role="write", plan="pro", expires_at=FUTURE)
    await tokens.create(role="read", name="dup")
    status, body = await redeem(served, {"id": invite_id, "secret": secret})
    assert status == 409 and body["error"]["code"] == "name_taken", body
    assert (await invites.list())[0]["state"] == "pending"
    with pytest.raises(ValueError, match=r"^name: an active token"):
        await invites.create(name="dup", role="write", plan="pro", expires_at=FUTURE)
    await tokens.revoke("dup")
    status, body = await redeem(served, {"id": invite_id, "secret": secret})
    assert status == 200 and body["role"] == "write"


async def test_racing_redeems_of_one_invite_get_one_token(served: Served) -> None:
    invite_id, secret = await served.hub.invites.create(name="race", role="write", plan="pro",
                                                        expires_at=FUTURE)
    answers = await asyncio.gather(*[redeem(served, {"id": invite_id, "secret": secret})
                                     for _ in range(6)])
    assert sorted(status for status, _ in answers) == [200] + [410] * 5
    assert len([t for t in await served.hub.tokens.list() if t["name"] == "race"]) == 1


@pytest.mark.parametrize(("body", "field"), [
    ({"secret": "s"}, "id"), ({"id": "XYZ", "secret": "s"}, "id"),
    ({"id": 12, "secret": "s"}, "id"), ({"id": "0" * 12}, "secret"),
    ({"id": "0" * 12, "secret": ""}, "secret"), ([1, 2], "id")])
async def test_a_bad_redeem_body_names_its_field(served: Served, body: object,
                                                 field: str) -> None:
    status, answer = await redeem(served, body)
    assert status == 422 and answer["error"]["field"] == field, answer
    assert answer["error"]["code"] == "invalid" and await served.hub.tokens.list() == []


async def test_redeem_attempts_are_limited_per_address(served: Served) -> None:
    attempts = served.app[INVITE_ATTEMPTS]
    attempts.limit = 3
    for _ in range(3):
        assert (await redeem(served, {"id": "0" * 12, "secret": "s"}))[0] == 401
    async with aiohttp.ClientSession() as s, s.post(
            served.url + "/v1/invites/redeem", json={"id": "0" * 12, "secret": "s"}) as r:
        assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
        assert (await r.json())["error"]["code"] == "too_many_attempts"


def test_attempts_open_again_after_the_window() -> None:
    now = [100.0]
    attempts = Attempts(limit=2, window=60.0, clock=lambda: now[0])
    assert attempts.check("a") is None and attempts.check("a") is None
    assert attempts.check("a") == 61
    assert attempts.check("b") is None  # per address
    now[0] += 60.0
    assert attempts.check("a") is None


async def test_a_hub_without_a_signing_key_takes_no_invites(hub_store: HubStore) -> None:
    runner = web.AppRunner(create_hub_app(hub_store))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        served = Served(f"http://127.0.0.1:{runner.addresses[0][1]}", hub_store, runner.app, "")
        status, body = await redeem(served, {"id": "0" * 12, "secret": "s"})
        assert status == 404 and "entitlements" in body["error"]["message"]
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------------- the invite's text

KEY = "xDK6SISad_6V4bf-o9OJZrxk4p9-NLKOCsfWYXuFPGM"
GOOD = InviteText(url="https://hub.example.com:8443/plane", id="0123456789ab",
                  secret="A" * 43, key=KEY)


def test_an_invite_text_round_trips() -> None:
    text = invite_text(GOOD)
    assert text.startswith("syncd-invite-1.") and "\n" not in text and " " not in text
    assert parse_invite(f"  {text}\n") == GOOD


def _encoded(payload: bytes) -> str:
    from syncd.entitlement.token import b64url
    return "syncd-invite-1." + b64url(payload)


@pytest.mark.parametrize(("text", "says"), [
    ("", "starts with"),
    ("syncd_abcdef", "hub token, not an invite"),
    ("https://hub.example.com", "starts with"),
    (invite_text(GOOD)[:-9], "damaged"),
    (invite_text(GOOD) + "!", "damaged"),
    ("syncd-invite-1." + "A" * 3000, "at most 2048"),
    (_encoded(b"[1, 2]"), "damaged"),
    (_encoded(b'{"url": "https://h", "id": "0123456789ab", "key": "k"}'), "damaged"),
    (invite_text(InviteText(url="ftp://h", id=GOOD.id, secret=GOOD.secret, key=KEY)), "url"),
    (invite_text(InviteText(url=GOOD.url, id="XYZ", secret=GOOD.secret, key=KEY)), "id"),
    (invite_text(InviteText(url=GOOD.url, id=GOOD.id, secret="short", key=KEY)), "secret"),
    (invite_text(InviteText(url=GOOD.url, id=GOOD.id, secret=GOOD.secret, key="AAAA")), "key"),
])
def test_a_malformed_invite_is_refused_naming_the_problem(text: str, says: str) -> None:
    with pytest.raises(MalformedInvite, match=says) as info:
        parse_invite(text)
    assert GOOD.secret not in str(info.value)


@pytest.mark.parametrize(("text", "secs"), [("90s", 90), ("30m", 1800), ("24h", 86400),
                                            ("1.5h", 5400), ("30d", 30 * 86400)])
def test_lifetimes(text: str, secs: float) -> None:
    assert parse_lifetime(text) == secs


@pytest.mark.parametrize("text", ["0h", "-1h", "31d", "24", "1w", "h"])
def test_a_bad_lifetime_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^expires:"):
        parse_lifetime(text)


# ---------------------------------------------------------------------- `syncd hub invite`

def test_the_invite_command_prints_one_line_and_keeps_only_a_hash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hub = tmp_path / "hub"
    create_token(hub, role="write", name="other")
    assert invite_main(["--data-dir", str(hub), "--name", "lap", "--url",
                        "https://hub.example.com/"]) == 0
    out, err = capsys.readouterr()
    (line,) = out.splitlines()
    invite = parse_invite(line)
    assert invite.url == "https://hub.example.com" and "works once" in err
    stored = (hub / INVITES_FILENAME).read_text()
    assert invite.secret not in stored and invite.id in stored
    assert (hub / INVITES_FILENAME).stat().st_mode & 0o777 == 0o600
    from syncd.hub.keys import load_key
    assert invite.key == public_key_text(load_key(hub / "entitlement-key.pem").public_key())
    assert invite_main(["--data-dir", str(hub), "--list", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["invites"]
    assert row["id"] == invite.id and row["state"] == "pending" and "secret_sha256" not in row
    assert invite_main(["--data-dir", str(hub), "--revoke", invite.id]) == 0
    assert "revoked invite" in capsys.readouterr().out
    assert invite_main(["--data-dir", str(hub), "--list"]) == 0
    assert "revoked" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "says"), [
    (["--name", "x", "--expires", "0h"], "expires:"),
    (["--name", "x", "--role", "admin"], "role:"),
    (["--name", "x", "--plan", "gold"], "plan:"),
    (["--name", "other"], "name: an active token"),
    (["--name", "x", "--url", "ftp://h"], "url"),
])
def test_the_invite_command_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              args: list[str], says: str) -> None:
    hub = tmp_path / "hub"
    create_token(hub, role="write", name="other")
    url = [] if "--url" in args else ["--url", "http://127.0.0.1:8787"]
    assert invite_main(["--data-dir", str(hub), *args, *url]) == 2
    assert says in capsys.readouterr().err
    assert not (hub / INVITES_FILENAME).exists()


def test_revoking_a_used_invite_names_the_token_to_revoke(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from syncd.hub.invites import create_invite, redeem_invite
    hub = tmp_path / "hub"
    hub.mkdir(mode=0o700)
    invite_id, secret = create_invite(hub, name="lap", role="write", plan="pro",
                                      expires_at=FUTURE)
    redeem_invite(hub, invite_id, secret, "2026-01-01T00:00:00Z")
    assert invite_main(["--data-dir", str(hub), "--revoke", invite_id]) == 1
    assert "syncd hub token revoke --name lap" in capsys.readouterr().err
    assert invite_main(["--data-dir", str(hub), "--revoke", "0" * 12]) == 1
    assert "no invite with id" in capsys.readouterr().err


def test_an_exposed_invites_file_grants_nothing(tmp_path: Path) -> None:
    from syncd.hub.invites import create_invite, redeem_invite
    from syncd.hub.tokens import TokenFileError
    hub = tmp_path / "hub"
    hub.mkdir(mode=0o700)
    invite_id, secret = create_invite(hub, name="lap", role="write", plan="pro",
                                      expires_at=FUTURE)
    (hub / INVITES_FILENAME).chmod(0o644)
    with pytest.raises(TokenFileError, match="chmod 600"):
        redeem_invite(hub, invite_id, secret, "2026-01-01T00:00:00Z")
    assert not (hub / TOKENS_FILENAME).exists()  # no token was made
    (hub / INVITES_FILENAME).chmod(0o600)
    assert redeem_invite(hub, invite_id, secret, "2026-01-01T00:00:00Z").name == "lap"


def test_the_invite_url_defaults_to_the_configured_hub_listen(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A wildcard listen address is reached over loopback here, and the note says to pass
    --url for other devices."""
    hub, config = tmp_path / "hub", tmp_path / "config.toml"
    hub.mkdir(mode=0o700)
    config.write_text('[hub]\nlisten = "0.0.0.0:9999"\n')
    assert invite_main(["--data-dir", str(hub), "--name", "lap"], config) == 0
    out, err = capsys.readouterr()
    assert parse_invite(out).url == "http://127.0.0.1:9999"
    assert "reachable from this machine only; pass --url" in err


def test_the_invite_command_on_a_postgresql_hub(pg_dsn: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert invite_main(["--store", pg_dsn, "--name", "lap", "--url", "https://h.example"]) == 0
    invite = parse_invite(capsys.readouterr().out)
    assert invite_main(["--store", pg_dsn, "--list", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["invites"]
    assert (row["id"], row["name"], row["state"]) == (invite.id, "lap", "pending")
    assert invite_main(["--store", pg_dsn, "--revoke", invite.id]) == 0
    assert invite_main(["--store", pg_dsn, "--list"]) == 0
    assert "revoked" in capsys.readouterr().out
