"""``syncd hub token create|list|revoke``, ``syncd hub invite`` and ``syncd hub key``: the
hub's tokens, invites (``invites.py``) and entitlement key, in the hub's store — a data
directory (``--data-dir``, SQLite hub) or a PostgreSQL database (``--store DSN`` or
``--store-file FILE``).

Exit codes: 0 done, 1 not found or I/O error, 2 bad input, 75 database unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from syncd.entitlement.token import public_key_text
from syncd.exits import EXIT_FAILED, EXIT_OK, EXIT_TEMPFAIL, EXIT_USAGE
from syncd.hub.dsn import resolve_dsn
from syncd.hub.invites import FileInvites, Invite, InviteStore
from syncd.hub.keys import load_or_create_key
from syncd.hub.store import FileTokens, StoreUnavailableError, TokenStore
from syncd.hub.tokens import PLANS

T = TypeVar("T")


def _where(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--data-dir", type=Path, help="a SQLite hub's data directory")
    group.add_argument("--store", help="a PostgreSQL hub's DSN (postgresql://…)")
    group.add_argument("--store-file", type=Path,
                       help="a 0600 file holding a PostgreSQL hub's DSN")


def token_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="syncd hub token", description="Manage hub API tokens.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command, help_ in [("create", "add a token and print it once"),
                           ("list", "show tokens (never their values)"),
                           ("revoke", "revoke the active token with this name")]:
        p = sub.add_parser(command, help=help_)
        _where(p)
        if command == "create":
            p.add_argument("--role", required=True, help="read, write or admin")
            p.add_argument("--plan", default="pro",
                           help=f"entitlement plan: {', '.join(PLANS)} (default pro)")
        if command != "list":
            p.add_argument("--name", required=True)
    return parser


TOKEN_COLUMNS = ("name", "role", "plan", "created_at", "revoked_at")


def _print_table(rows: list[dict[str, str | None]], cols: tuple[str, ...]) -> None:
    cells = [[c.upper() for c in cols]] + [[row[c] or "-" for c in cols] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


@dataclass(frozen=True)
class Admin:
    """What an admin command works on: the hub's tokens, invites and signing key."""

    tokens: TokenStore
    invites: InviteStore
    signing_key: Callable[[], Awaitable[Ed25519PrivateKey]]


async def _with_hub(args: argparse.Namespace, work: Callable[[Admin], Awaitable[T]]) -> T:
    """Run ``work`` against the store the arguments name."""
    dsn = resolve_dsn(args.store, args.store_file) if args.data_dir is None else None
    if dsn is None:
        data_dir = args.data_dir.expanduser()
        if not getattr(args, "creates", False) and not data_dir.is_dir():
            # a typo would list no tokens, or mint a key the hub never uses
            raise OSError(f"--data-dir: no hub data directory at {data_dir} (a hub creates it "
                          "when it first starts, or `syncd hub token create` does)")
        return await work(Admin(FileTokens(data_dir), FileInvites(data_dir),
                                lambda: asyncio.to_thread(load_or_create_key, data_dir)))
    from syncd.hub.pg import PgHubStore
    hub = await PgHubStore.admin(dsn)
    try:
        return await work(Admin(hub.tokens, hub.invites, hub.signing_key))
    finally:
        await hub.close()


def _run(prog: str, args: argparse.Namespace, work: Callable[[Admin], Awaitable[int]]) -> int:
    try:
        return asyncio.run(_with_hub(args, work))
    except StoreUnavailableError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_TEMPFAIL
    except (ValueError, OSError) as exc:  # ValueError includes TokenFileError, KeyFileError
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FAILED


def _parsed(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    try:
        return parser.parse_args(argv)
    except SystemExit as e:  # argparse already wrote the usage error (2) or the help (0)
        return e.code if isinstance(e.code, int) else EXIT_USAGE


def token_main(argv: list[str]) -> int:
    """``syncd hub token create|list|revoke``."""
    args = _parsed(token_parser(), argv)
    if isinstance(args, int):
        return args
    args.creates = args.command == "create"  # the first token may come before the hub

    async def work(hub: Admin) -> int:
        tokens = hub.tokens
        if args.command == "create":
            print(await tokens.create(role=args.role, name=args.name, plan=args.plan))
            print("this token is shown only once; store it now", file=sys.stderr)
        elif args.command == "list":
            _print_table(await tokens.list(), TOKEN_COLUMNS)
        elif not await tokens.revoke(args.name):
            print(f"syncd hub token: name: no active token named {args.name!r}",
                  file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK

    return _run("syncd hub token", args, work)


def key_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="syncd hub key", description="Print the hub's "
                                     "entitlement public key, for [entitlement] public_keys.")
    _where(parser)
    return parser


def key_main(argv: list[str]) -> int:
    """``syncd hub key``: the public key laptops pin (the key is created if missing)."""
    from syncd.entitlement.token import key_id, public_key_text
    args = _parsed(key_parser(), argv)
    if isinstance(args, int):
        return args

    async def work(hub: Admin) -> int:
        public = (await hub.signing_key()).public_key()
        print(public_key_text(public))
        print(f"key id {key_id(public)}; pin it with: [entitlement] public_keys = "
              f'["{public_key_text(public)}"]', file=sys.stderr)
        return EXIT_OK

    return _run("syncd hub key", args, work)


INVITE_COLUMNS = ("id", "name", "role", "plan", "state", "created_at", "expires_at")


def invite_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="syncd hub invite", description="Make a one-use invite a laptop joins the hub with "
        "(`syncd join INVITE`), list invites, or revoke one.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--name", help="the token the invite becomes is named so (one per "
                        "device, e.g. alice-laptop)")
    action.add_argument("--list", action="store_true", help="show invites (never secrets)")
    action.add_argument("--revoke", metavar="ID", help="revoke the unused invite with this id")
    _where(parser)
    parser.add_argument("--role", default="write", help="read or write (default write)")
    parser.add_argument("--plan", default="pro",
                        help=f"entitlement plan: {', '.join(PLANS)} (default pro)")
    parser.add_argument("--url", help="the hub's URL as the laptop reaches it (default: "
                        "http:// and hub.listen from the config)")
    parser.add_argument("--expires", default="24h", help="how long it works: 30m, 24h, 7d "
                        "(default 24h, at most 30d)")
    parser.add_argument("--json", action="store_true", help="--list as JSON")
    return parser


def _hub_url(url: str | None, config_path: Path | None) -> tuple[str, bool]:
    """The invite's hub URL (checked as ``control_plane.url`` is) and whether it is loopback."""
    import urllib.parse

    from syncd.config import (
        ControlPlaneConfig,
        is_loopback_host,
        load_config,
        local_url,
        parse_listen,
    )
    if url is None:
        url = local_url(*parse_listen(load_config(config_path).hub.listen))
    checked = ControlPlaneConfig(url=url).url
    assert checked is not None
    host = urllib.parse.urlsplit(checked).hostname or ""
    return checked, is_loopback_host(host)


def invite_main(argv: list[str], config_path: Path | None = None) -> int:
    """``syncd hub invite --name NAME | --list | --revoke ID``."""
    from syncd.config import ConfigError
    from syncd.hub import invites
    from syncd.hub.tokens import now_text
    args = _parsed(invite_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        lifetime = invites.parse_lifetime(args.expires)
        url, loopback = _hub_url(args.url, config_path) if args.name else ("", False)
    except (ValueError, ConfigError) as exc:
        print(f"syncd hub invite: {'url: ' if isinstance(exc, ConfigError) else ''}{exc}",
              file=sys.stderr)
        return EXIT_USAGE

    async def work(hub: Admin) -> int:
        if args.list:
            rows = await hub.invites.list()
            if args.json:
                print(json.dumps({"invites": rows}, indent=2))
            else:
                _print_table(rows, INVITE_COLUMNS)
            return EXIT_OK
        if args.revoke:
            return _revoked(args.revoke, await hub.invites.revoke(args.revoke, now=now_text()))
        invites.check_new_invite(name=args.name, role=args.role, plan=args.plan)
        key = (await hub.signing_key()).public_key()
        until = invites.expires_at(lifetime)
        invite_id, secret = await hub.invites.create(name=args.name, role=args.role,
                                                     plan=args.plan, expires_at=until)
        print(invites.invite_text(invites.InviteText(url=url, id=invite_id, secret=secret,
                                                     key=public_key_text(key))))
        print(f"invite {invite_id}: token {args.name!r} ({args.role}, plan {args.plan}) for "
              f"{url}; works once, until {until}. On the new device: syncd join INVITE",
              file=sys.stderr)
        if loopback:
            print(f"syncd hub invite: note: {url} is reachable from this machine only; pass "
                  "--url with the address other devices reach the hub at", file=sys.stderr)
        return EXIT_OK

    return _run("syncd hub invite", args, work)


def _revoked(invite_id: str, before: Invite | None) -> int:
    from syncd.hub.invites import state
    from syncd.hub.tokens import now_text
    if before is None:
        print(f"syncd hub invite: revoke: no invite with id {invite_id!r}", file=sys.stderr)
        return EXIT_FAILED
    was = state(before, now_text())
    if was == "used":
        print(f"syncd hub invite: revoke: invite {invite_id} was already used (at "
              f"{before.used_at}): revoke its token with `syncd hub token revoke --name "
              f"{before.name}`", file=sys.stderr)
        return EXIT_FAILED
    if was == "revoked":
        print(f"syncd hub invite: invite {invite_id} was already revoked (at "
              f"{before.revoked_at})", file=sys.stderr)
        return EXIT_OK
    print(f"revoked invite {invite_id} ({before.name})")
    return EXIT_OK
