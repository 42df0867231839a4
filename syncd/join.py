"""``syncd join INVITE``: pair this device with a hub in one step (docs/pairing.md).

The invite (``syncd/hub/invites.py``) is traded at the hub for this device's own token, which
goes to the token file; the hub's URL, the token file's path and the hub's entitlement key
(from the invite, never from the network) go into the config file.

Rules:
  1. Nothing is written unless everything worked: the invite is parsed, the config read and
     the merged config computed and verified (``config_edit.py``) before the hub is asked; the
     hub's token is checked (an entitlement fetched with it must verify under the invite's key,
     and name the invite's token) before a byte is written. A refused invite, an unreachable
     hub or a failed check leaves the config file and the token file as they were.
  2. An option already set to another value is a conflict, named, and refused without
     ``--force``: ``control_plane.url``, and a token file that already holds a token. The key
     is added to ``entitlement.public_keys`` beside any already pinned (adding one overwrites
     nothing). ``control_plane.token_file``, when already set, is where the token goes.
  3. The token never passes through the terminal: it is in no argument, no output and no log
     line. It is written 0600 (its directory made 0700 when join creates it), atomically; then
     the config, atomically, keeping its mode, the previous one kept beside it
     (``BACKUP_SUFFIX``).
  4. The hub is reached as the daemon reaches it: ``control_plane.proxy`` or the proxy
     variables (``syncd.sync.proxy``).
"""

from __future__ import annotations

import asyncio
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from syncd.config_edit import EditError, Option, get_option, set_options
from syncd.hub.invites import REDEEM_PATH, InviteText, MalformedInvite, parse_invite
from syncd.setup import BACKUP_SUFFIX, replace_file

TOKEN_FILE_NAME = "control-plane-token"  # beside the config file, as deploy/syncd.example.toml
CHECK_DEVICE = "syncd-join-check"  # the entitlement check's device before the store exists
TIMEOUT_SECS = 30.0
URL: Option = ("control_plane", "url")
TOKEN_FILE: Option = ("control_plane", "token_file")
KEYS: Option = ("entitlement", "public_keys")


class JoinError(Exception):
    """Joining failed; nothing was written. ``kind``: ``usage`` (bad invite, conflicting
    config: exit 2), ``refused`` (the hub said no: exit 1), ``unreachable`` (exit 75)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclass
class Plan:
    """What join will write, computed before the hub is asked."""

    invite: InviteText
    config_path: Path
    config_before: bytes | None
    config_after: str
    token_path: Path
    proxy: str | None
    device_id: str  # the entitlement check's device: this install's, when its store exists
    data_dir: Path
    changed: list[str] = field(default_factory=list)  # the options the new config changes


@dataclass
class Joined:
    name: str
    role: str
    plan: str
    features: list[str]
    key_id: str


def plan_join(invite_text: str, config_path: Path, data_dir: Path | None, *,
              force: bool = False, env: dict[str, str] | None = None) -> Plan:
    """Parse and check everything local (rules 1-2); ``JoinError("usage")`` otherwise."""
    try:
        invite = parse_invite(invite_text)
    except MalformedInvite as exc:
        raise JoinError("usage", f"INVITE: {exc}") from None
    before, text = _read_config(config_path)
    from syncd.config import ConfigError, parse_config
    environ = dict(os.environ) if env is None else env
    try:
        config = parse_config(before or b"", source=str(config_path), env=environ)
        document = tomllib.loads(text)
    except ConfigError as exc:
        raise JoinError("usage", f"the config is not valid, so join leaves it alone: {exc}") \
            from None
    plane = config.control_plane
    token_path = plane.token_file or config_path.parent / TOKEN_FILE_NAME
    _check_conflicts(document, invite.url, token_path, force)
    keys = list(config.entitlement.public_keys)
    values: dict[Option, str | list[str]] = {URL: invite.url, TOKEN_FILE: str(token_path),
                                             KEYS: keys if invite.key in keys else
                                             [*keys, invite.key]}
    changed = [f"{s}.{k}" for (s, k), v in values.items() if get_option(document, (s, k)) != v]
    try:
        after = set_options(text, values)
        parse_config(after.encode(), source=str(config_path), env=environ)
    except (EditError, ConfigError) as exc:
        raise JoinError("usage", f"{config_path}: {exc}") from None
    return Plan(invite=invite, config_path=config_path, config_before=before,
                config_after=after, token_path=token_path, proxy=plane.proxy,
                device_id=_device_id(data_dir or config.daemon.data_dir),
                data_dir=data_dir or config.daemon.data_dir, changed=changed)


def _read_config(path: Path) -> tuple[bytes | None, str]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        raise JoinError("usage", f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        return raw, raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise JoinError("usage", f"{path} is not UTF-8 text; join leaves it alone") from None


def _check_conflicts(document: dict[str, Any], url: str, token_path: Path, force: bool) -> None:
    conflicts = []
    current = get_option(document, URL)
    if current is not None and str(current).rstrip("/") != url:
        conflicts.append(f"control_plane.url is {current!r}, the invite's hub is {url!r}")
    try:
        held = token_path.read_bytes().strip()
    except FileNotFoundError:
        held = b""
    except OSError as exc:
        raise JoinError("usage", f"control_plane.token_file {str(token_path)!r}: cannot read "
                        f"it: {exc.strerror or exc}") from None
    if held:
        conflicts.append(f"control_plane.token_file {str(token_path)!r} already holds a token")
    if conflicts and not force:
        raise JoinError("usage", "; ".join(conflicts) + " (--force replaces them)")


async def redeem(plan: Plan) -> tuple[Joined, str]:
    """Trade the invite for a token and check it (rule 1); the token is returned, not shown."""
    from syncd.sync.proxy import choose_proxy
    invite = plan.invite
    proxy = choose_proxy(invite.url, plan.proxy, os.environ)
    credentials = {} if proxy is None or proxy.authorization is None else {
        "Proxy-Authorization": proxy.authorization}
    tunnelled = invite.url.startswith("https:")  # as PlaneClient: on the CONNECT only
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECS),
                                         trust_env=False) as session, session.post(
                invite.url + REDEEM_PATH, json={"id": invite.id, "secret": invite.secret},
                headers={} if tunnelled else credentials,
                proxy=None if proxy is None else proxy.url,
                proxy_headers=credentials if tunnelled else None) as resp:
            status, body = resp.status, await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        via = "" if proxy is None else f" (through the proxy {proxy.url}, from {proxy.source})"
        raise JoinError("unreachable", f"cannot reach the hub at {invite.url}{via}: "
                        f"{type(exc).__name__}: {exc}; nothing was written") from None
    answer = _answer(status, body, invite.url)
    if answer.get("public_key") != invite.key:
        raise JoinError("refused", f"the hub at {invite.url} signs with another key than the "
                        f"invite names; nothing was written. Ask the hub's admin for a new "
                        f"invite and to revoke the token {answer.get('name')!r}")
    token = str(answer["token"])
    return await _check(plan, token, str(answer["name"]), str(answer.get("role"))), token


def _answer(status: int, body: bytes, url: str) -> dict[str, Any]:
    import json
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if status == 200 and isinstance(answer, dict) and isinstance(answer.get("token"), str):
        return answer
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        kind = "unreachable" if status in (429, 503) else "refused"
        raise JoinError(kind, f"the hub refused the invite ({error.get('code')}): "
                        f"{error['message']}; nothing was written")
    raise JoinError("refused", f"{url}{REDEEM_PATH} answered HTTP {status} without syncd's "
                    "JSON: is this a syncd hub (new enough to take invites)?")


async def _check(plan: Plan, token: str, name: str, role: str) -> Joined:
    """An entitlement for this device, fetched with the new token, verified under the
    invite's key: the token works and the pinned key is the hub's."""
    from syncd.entitlement.token import TokenError, key_id, parse_public_key, pin, verify
    from syncd.sync.plane import PlaneClient, PlaneError
    plane = PlaneClient(plan.invite.url, token, proxy=plan.proxy, timeout=TIMEOUT_SECS)
    try:
        signed, _ = await plane.entitlement(plan.device_id)
        claims = verify(signed, pin([plan.invite.key]))
    except (PlaneError, TokenError) as exc:
        raise JoinError("refused", f"the hub gave a token, but checking it failed ({exc}); "
                        f"nothing was written. Ask the hub's admin to revoke the token "
                        f"{name!r} and for a new invite") from None
    finally:
        await plane.close()
    if claims.sub != name:
        raise JoinError("refused", f"the hub's entitlement names token {claims.sub!r}, not "
                        f"{name!r}; nothing was written")
    return Joined(name=name, role=role, plan=claims.plan, features=list(claims.features),
                  key_id=key_id(parse_public_key(plan.invite.key)))


def _device_id(data_dir: Path) -> str:
    """This install's device id when its store exists (the daemon's), else ``CHECK_DEVICE``."""
    import sqlite3

    from local_store.db import DB_FILENAME, replica_id_of
    db = data_dir / DB_FILENAME
    try:
        return (replica_id_of(db) if db.exists() else None) or CHECK_DEVICE
    except sqlite3.Error:
        return CHECK_DEVICE


def write(plan: Plan, token: str) -> None:
    """The token file, then the config (rule 3)."""
    directory = plan.token_path.parent
    if not directory.exists():
        directory.mkdir(parents=True, mode=0o700)
    replace_file(plan.token_path, (token + "\n").encode(), 0o600)
    mode = 0o644
    if plan.config_before is not None:
        mode = plan.config_path.stat().st_mode & 0o777
        replace_file(plan.config_path.with_name(plan.config_path.name + BACKUP_SUFFIX),
                 plan.config_before, mode)
    plan.config_path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(plan.config_path, plan.config_after.encode(), mode)


def join(invite_text: str, config_path: Path, data_dir: Path | None, *,
         force: bool = False) -> dict[str, Any]:
    """The whole join (rules above): what was written, as ``--json`` prints it."""
    plan = plan_join(invite_text, config_path, data_dir, force=force)
    joined, token = asyncio.run(redeem(plan))
    write(plan, token)
    return {"hub": plan.invite.url, "name": joined.name, "role": joined.role,
            "plan": joined.plan,
            "features": joined.features, "config": str(plan.config_path),
            "token_file": str(plan.token_path), "public_key": plan.invite.key,
            "key_id": joined.key_id, "changed": plan.changed,
            "backup": None if plan.config_before is None else
            str(plan.config_path) + BACKUP_SUFFIX, "daemon_running": _daemon_running(plan.data_dir)}


def _daemon_running(data_dir: Path) -> bool:
    """A daemon of this data directory runs (its state file names a live process): it reads
    the config only when it starts."""
    from syncd.state import read_state
    pid = (read_state(data_dir) or {}).get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
