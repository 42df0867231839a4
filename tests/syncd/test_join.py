"""``syncd join INVITE`` (``syncd/join.py``) against a real hub on a loopback port: the token
file and the config it writes, and everything it refuses — a used, expired, revoked or
malformed invite, a conflicting config, an unreachable hub — leaving both files as they were,
byte for byte. Then the whole product as processes: two laptops joined with two invites, a
save on one recalled on the other."""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from syncd.config import parse_config
from syncd.config_edit import EditError, set_options
from syncd.entitlement.token import public_key_text
from syncd.hub.app import create_hub_app
from syncd.hub.invites import InviteText, invite_text
from syncd.hub.store import SqliteHubStore
from syncd.join import BACKUP_SUFFIX, TOKEN_FILE_NAME, JoinError, join
from tests.syncd.processes import cli, spawn, stop_all, wait_ready

FUTURE, PAST = "2099-01-01T00:00:00Z", "2000-01-01T00:00:00Z"
OTHER_KEY = "xDK6SISad_6V4bf-o9OJZrxk4p9-NLKOCsfWYXuFPGM"  # a licence key pinned before
CONFIG = """\
# my laptop
[daemon]
log_level = "debug"   # loud for now

[control_plane]
embedding_model = "hashing-384"  # the hub's model

[sync]
interval_secs = 3600
"""


@dataclass
class Hub:
    url: str
    hub: SqliteHubStore
    key: str

    async def invite(self, name: str, *, expires_at: str = FUTURE, role: str = "write",
                     url: str | None = None) -> str:
        invite_id, secret = await self.hub.invites.create(name=name, role=role, plan="pro",
                                                          expires_at=expires_at)
        return invite_text(InviteText(url=url or self.url, id=invite_id, secret=secret,
                                      key=self.key))


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    store = await Store.open(tmp_path / "hub", embedder=HashingEmbedder(), feed=True)
    backend = SqliteHubStore(store)
    key = await backend.signing_key()
    runner = web.AppRunner(create_hub_app(backend, signing_key=key))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Hub(f"http://127.0.0.1:{runner.addresses[0][1]}", backend,
                  public_key_text(key.public_key()))
    finally:
        await runner.cleanup()
        await store.close()


def snapshot(*paths: Path) -> list[bytes | None]:
    return [p.read_bytes() if p.exists() else None for p in paths]


async def refused(invite: str, config: Path, **kw: bool) -> JoinError:
    with pytest.raises(JoinError) as info:
        await asyncio.to_thread(join, invite, config, config.parent / "data", **kw)
    return info.value


async def test_join_writes_the_token_file_and_merges_the_config(hub: Hub,
                                                                tmp_path: Path) -> None:
    config = tmp_path / "laptop" / "config.toml"
    config.parent.mkdir()
    config.write_text(CONFIG)
    config.chmod(0o640)
    invite = await hub.invite("alice-laptop")
    done = await asyncio.to_thread(join, invite, config, tmp_path / "data")
    token_file = config.parent / TOKEN_FILE_NAME
    token = token_file.read_text().strip()
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert await hub.hub.tokens.authenticate(f"Bearer {token}", "write") == (
        "alice-laptop", "write")
    assert token not in json.dumps(done)
    assert config.read_text() == CONFIG.replace(
        'embedding_model = "hashing-384"  # the hub\'s model\n',
        f'embedding_model = "hashing-384"  # the hub\'s model\nurl = "{hub.url}"\n'
        f'token_file = "{token_file}"\n') + f'\n[entitlement]\npublic_keys = ["{hub.key}"]\n'
    assert config.stat().st_mode & 0o777 == 0o640
    assert (config.parent / ("config.toml" + BACKUP_SUFFIX)).read_text() == CONFIG
    loaded = parse_config(config.read_bytes())
    assert loaded.control_plane.url == hub.url and loaded.control_plane.token_file == token_file
    assert loaded.entitlement.public_keys == (hub.key,) and loaded.sync.interval_secs == 3600
    assert done["name"] == "alice-laptop" and done["role"] == "write" and done["plan"] == "pro"
    assert done["changed"] == ["control_plane.url", "control_plane.token_file",
                               "entitlement.public_keys"]
    assert done["features"] == ["sync", "graph"] and len(done["key_id"]) == 16


async def test_join_creates_a_missing_config(hub: Hub, tmp_path: Path) -> None:
    config = tmp_path / "new" / "syncd" / "config.toml"
    done = await asyncio.to_thread(join, await hub.invite("fresh"), config, None)
    assert tomllib.loads(config.read_text()) == {
        "control_plane": {"url": hub.url, "token_file": str(config.parent / TOKEN_FILE_NAME)},
        "entitlement": {"public_keys": [hub.key]}}
    assert done["backup"] is None
    assert (config.parent / TOKEN_FILE_NAME).stat().st_mode & 0o777 == 0o600


async def test_a_used_invite_is_refused_and_nothing_is_written(hub: Hub, tmp_path: Path) -> None:
    invite = await hub.invite("once")
    first = tmp_path / "a" / "config.toml"
    await asyncio.to_thread(join, invite, first, None)
    second = tmp_path / "b" / "config.toml"
    second.parent.mkdir()
    second.write_text(CONFIG)
    before = snapshot(second, second.parent / TOKEN_FILE_NAME)
    error = await refused(invite, second)
    assert error.kind == "refused" and "invite_used" in error.message
    assert "already used" in error.message and "nothing was written" in error.message
    assert snapshot(second, second.parent / TOKEN_FILE_NAME) == before
    assert sorted(p.name for p in second.parent.iterdir()) == ["config.toml"]


@pytest.mark.parametrize("how", ["expired", "revoked"])
async def test_an_expired_or_revoked_invite_is_refused_and_nothing_is_written(
        hub: Hub, tmp_path: Path, how: str) -> None:
    invite = await hub.invite("late", expires_at=PAST if how == "expired" else FUTURE)
    if how == "revoked":
        (row,) = await hub.hub.invites.list()
        assert row["id"] is not None
        await hub.hub.invites.revoke(row["id"], now="2026-01-01T00:00:00Z")
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    before = snapshot(config, tmp_path / TOKEN_FILE_NAME)
    error = await refused(invite, config)
    assert error.kind == "refused" and f"invite_{how}" in error.message, error.message
    assert snapshot(config, tmp_path / TOKEN_FILE_NAME) == before
    assert await hub.hub.tokens.list() == []


def _malformed(good: str) -> list[str]:
    return ["", "   ", "syncd_" + "x" * 40, "hello", good[:40], good[:-3], good + "A",
            good.replace("syncd-invite-1.", "syncd-invite-2."), good.upper()]


async def test_a_malformed_invite_is_refused_before_the_hub_is_asked(
        hub: Hub, tmp_path: Path) -> None:
    good = await hub.invite("shape")
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    before = snapshot(config, tmp_path / TOKEN_FILE_NAME)
    for text in _malformed(good):
        error = await refused(text, config)
        assert error.kind == "usage" and error.message.startswith("INVITE: "), (text, error)
        assert snapshot(config, tmp_path / TOKEN_FILE_NAME) == before
    assert (await hub.hub.invites.list())[0]["state"] == "pending"


async def test_a_conflicting_config_is_refused_by_name_unless_forced(
        hub: Hub, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.replace("[control_plane]\n", '[control_plane]\nurl = '
                                     '"https://other.example.com"\n'))
    token_file = tmp_path / TOKEN_FILE_NAME
    token_file.write_text("syncd_old\n")
    before = snapshot(config, token_file)
    invite = await hub.invite("conflict")
    error = await refused(invite, config)
    assert error.kind == "usage"
    assert "control_plane.url is 'https://other.example.com'" in error.message
    assert "already holds a token" in error.message and "--force" in error.message
    assert snapshot(config, token_file) == before
    assert (await hub.hub.invites.list())[0]["state"] == "pending"  # the hub was not asked
    await asyncio.to_thread(join, invite, config, None, force=True)
    assert parse_config(config.read_bytes()).control_plane.url == hub.url
    assert token_file.read_text().strip() != "syncd_old"


async def test_an_existing_token_file_setting_is_where_the_token_goes(
        hub: Hub, tmp_path: Path) -> None:
    elsewhere = tmp_path / "secrets" / "plane"
    config = tmp_path / "config.toml"
    config.write_text(f'[control_plane]\ntoken_file = "{elsewhere}"\n'
                      f'[entitlement]\npublic_keys = [\n  "{OTHER_KEY}",\n]\n')
    done = await asyncio.to_thread(join, await hub.invite("elsewhere"), config, None)
    assert done["token_file"] == str(elsewhere) and elsewhere.read_text().startswith("syncd_")
    assert elsewhere.parent.stat().st_mode & 0o777 == 0o700
    assert parse_config(config.read_bytes()).entitlement.public_keys == (OTHER_KEY, hub.key)


async def test_a_config_join_cannot_edit_safely_is_left_alone(hub: Hub, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('entitlement = { public_keys = [] }\n')
    before = snapshot(config, tmp_path / TOKEN_FILE_NAME)
    error = await refused(await hub.invite("inline"), config)
    assert error.kind == "usage" and "write them by hand" in error.message, error.message
    assert snapshot(config, tmp_path / TOKEN_FILE_NAME) == before
    config.write_text("[daemon\n")
    error = await refused(await hub.invite("broken"), config)
    assert error.kind == "usage" and "not valid" in error.message


async def test_an_unreachable_hub_writes_nothing(hub: Hub, tmp_path: Path) -> None:
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "config.toml"
    invite = await hub.invite("away", url=f"http://127.0.0.1:{port}")
    error = await refused(invite, config)
    assert error.kind == "unreachable" and "cannot reach the hub" in error.message
    assert not config.exists() and not (tmp_path / TOKEN_FILE_NAME).exists()


async def test_an_invite_naming_another_key_is_refused(hub: Hub, tmp_path: Path) -> None:
    """The pinned key comes from the invite, never the network: a hub that signs with
    another key is not trusted (nor written)."""
    invite_id, secret = await hub.hub.invites.create(name="mitm", role="write", plan="pro",
                                                     expires_at=FUTURE)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    other = public_key_text(Ed25519PrivateKey.generate().public_key())
    forged = invite_text(InviteText(url=hub.url, id=invite_id, secret=secret, key=other))
    config = tmp_path / "config.toml"
    error = await refused(forged, config)
    assert error.kind == "refused" and "another key" in error.message
    assert not config.exists() and not (tmp_path / TOKEN_FILE_NAME).exists()


@pytest.mark.parametrize(("before", "after"), [
    ("", '[s]\nk = "v"\n'),
    ("[s]\nk = 1", '[s]\nk = "v"\n'),
    ("# top\n[s] # c\nk = [\n  1,\n  2,\n]  # old\nother = 2\n\n# tail\n",
     '# top\n[s] # c\nk = "v"\nother = 2\n\n# tail\n'),
    ("[s]\nother = 1\n\n# later\n[t]\nx = 1\n",
     '[s]\nother = 1\nk = "v"\n\n# later\n[t]\nx = 1\n'),
    ("[t]\nx = 1\n", '[t]\nx = 1\n\n[s]\nk = "v"\n'),
])
def test_set_options_keeps_every_other_line(before: str, after: str) -> None:
    assert set_options(before, {("s", "k"): "v"}) == after


@pytest.mark.parametrize("text", ["s = { k = 1 }\n", "s.k = 1\n", '[s]\n"k" = 1\n'])
def test_set_options_refuses_what_it_cannot_edit_safely(text: str) -> None:
    with pytest.raises(EditError, match="by hand"):
        set_options(text, {("s", "k"): "v"})


async def test_two_laptops_joined_with_two_invites_share_memories(tmp_path: Path) -> None:
    """The whole product as processes: `syncd hub invite` twice, `syncd join` on each laptop
    (the token on no terminal), two daemons, a save on one recalled on the other after a sync
    pass on both."""
    hub_dir = tmp_path / "hub"
    hub = await spawn(tmp_path, "hub", "--data-dir", str(hub_dir), "--listen", "127.0.0.1:0")
    procs = [hub]
    try:
        hub_url = await wait_ready(hub)
        laptops = {}
        for name in ("a", "b"):
            code, invite, err = await cli(tmp_path, "hub", "invite", "--data-dir", str(hub_dir),
                                          "--name", f"laptop-{name}", "--url", hub_url)
            assert code == 0 and len(invite.splitlines()) == 1, err
            config = tmp_path / name / "config.toml"
            config.parent.mkdir()
            config.write_text(CONFIG)
            data = tmp_path / name / "data"
            where = ["--config", str(config), "--data-dir", str(data)]
            code, out, err = await cli(tmp_path, *(  # both spellings: before and after `join`
                [*where, "join", invite.strip()] if name == "a" else
                ["join", invite.strip(), "--json", *where]))
            assert code == 0, err + out
            token = (config.parent / TOKEN_FILE_NAME).read_text().strip()
            assert token.startswith("syncd_") and token not in out + err
            if name == "b":
                assert json.loads(out)["name"] == "laptop-b"
            else:
                assert out.startswith(f"joined {hub_url} as 'laptop-a' (role write")
            code, out, err = await cli(tmp_path, "--config", str(config), "join",
                                       invite.strip(), "--force")
            assert code == 1 and "invite_used" in err, err  # works once, also through the CLI
            proc = await spawn(tmp_path, "--config", str(config), "--data-dir", str(data),
                               "run", "--listen", "127.0.0.1:0")
            procs.append(proc)
            await wait_ready(proc)
            laptops[name] = ["--config", str(config), "--data-dir", str(data)]
        code, _, err = await cli(tmp_path, *laptops["a"], "save", "the staging keys rotate "
                                 "on Mondays", "--type", "procedure")
        assert code == 0, err
        # A save is pushed at once (and B's long-poll may pull it at once): a manual pass on
        # each side then leaves nothing unpushed on A and the memory on B, whoever moved it.
        code, out, err = await cli(tmp_path, *laptops["a"], "sync", "--json")
        assert code == 0 and json.loads(out)["ok"], err + out
        code, out, err = await cli(tmp_path, *laptops["a"], "status", "--json")
        assert code == 0 and json.loads(out)["outbox"] == 0, err + out
        code, out, err = await cli(tmp_path, *laptops["b"], "sync", "--json")
        assert code == 0 and json.loads(out)["ok"], err + out
        code, out, err = await cli(tmp_path, *laptops["b"], "recall", "staging keys")
        assert code == 0 and "the staging keys rotate on Mondays" in out, err + out
        code, out, _ = await cli(tmp_path, *laptops["b"], "status", "--json")
        entitlement = json.loads(out)["entitlement"]
        assert entitlement["entitled"] and entitlement["sync"] == "on", entitlement
    finally:
        await stop_all(procs)


async def test_join_reads_the_invite_from_standard_input(hub: Hub, tmp_path: Path) -> None:
    """`syncd join -`: the invite stays out of the shell's history and the process list; a
    malformed one is a usage error (exit 2)."""
    import sys

    from tests.syncd.processes import env_for

    async def join_stdin(text: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "syncd", "join", "-", "--config", str(config),
            env=env_for(tmp_path), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        async with asyncio.timeout(60):
            out, err = await proc.communicate(text.encode())
        assert proc.returncode is not None
        return proc.returncode, (out + err).decode()

    config = tmp_path / "config.toml"
    code, output = await join_stdin("syncd-invite-1.AAAA\n")
    assert code == 2 and "INVITE: the invite is damaged" in output and not config.exists()
    code, output = await join_stdin(await hub.invite("piped") + "\n")
    assert code == 0 and "joined" in output, output
    token = (tmp_path / TOKEN_FILE_NAME).read_text().strip()
    assert token not in output
    assert await hub.hub.tokens.authenticate(f"Bearer {token}", "write") == ("piped", "write")


async def test_join_says_whether_a_running_daemon_must_restart(hub: Hub, tmp_path: Path) -> None:
    """A daemon reads its config only when it starts: the answer says whether this data
    directory's daemon runs (its state file names a live process)."""
    import os
    data = tmp_path / "data"
    data.mkdir()
    (data / "daemon.json").write_text(json.dumps({"pid": os.getpid(), "url": "http://x"}))
    done = await asyncio.to_thread(join, await hub.invite("live"), tmp_path / "a" / "c.toml", data)
    assert done["daemon_running"] is True
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()  # a pid that has exited
    (data / "daemon.json").write_text(json.dumps({"pid": proc.pid, "url": "http://x"}))
    done = await asyncio.to_thread(join, await hub.invite("gone"), tmp_path / "b" / "c.toml", data)
    assert done["daemon_running"] is False
