"""``syncd hub token create|list|revoke`` and ``syncd hub key``: the hub's tokens and
entitlement key, in the hub's store — a data directory (``--data-dir``, SQLite hub) or a
PostgreSQL database (``--store DSN`` or ``--store-file FILE``).

Exit codes: 0 done, 1 not found or I/O error, 2 bad input, 75 database unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from syncd.exits import EXIT_FAILED, EXIT_OK, EXIT_TEMPFAIL, EXIT_USAGE
from syncd.hub.dsn import resolve_dsn
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


def _print_table(rows: list[dict[str, str | None]]) -> None:
    cols = ["name", "role", "plan", "created_at", "revoked_at"]
    cells = [[c.upper() for c in cols]] + [[row[c] or "-" for c in cols] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


async def _with_hub(args: argparse.Namespace,
                    work: Callable[[TokenStore, Callable[[], Awaitable[Ed25519PrivateKey]]],
                                   Awaitable[T]]) -> T:
    """Run ``work(tokens, signing_key)`` against the store the arguments name."""
    dsn = resolve_dsn(args.store, args.store_file) if args.data_dir is None else None
    if dsn is None:
        data_dir = args.data_dir.expanduser()
        if not getattr(args, "creates", False) and not data_dir.is_dir():
            # a typo would list no tokens, or mint a key the hub never uses
            raise OSError(f"--data-dir: no hub data directory at {data_dir} (a hub creates it "
                          "when it first starts, or `syncd hub token create` does)")
        return await work(FileTokens(data_dir),
                          lambda: asyncio.to_thread(load_or_create_key, data_dir))
    from syncd.hub.pg import PgHubStore
    hub = await PgHubStore.admin(dsn)
    try:
        return await work(hub.tokens, hub.signing_key)
    finally:
        await hub.close()


def _run(prog: str, args: argparse.Namespace,
         work: Callable[[TokenStore, Callable[[], Awaitable[Ed25519PrivateKey]]],
                        Awaitable[int]]) -> int:
    try:
        return asyncio.run(_with_hub(args, work))
    except StoreUnavailableError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_TEMPFAIL
    except (ValueError, OSError) as exc:  # ValueError includes TokenFileError, KeyFileError
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FAILED


def token_main(argv: list[str]) -> int:
    """``syncd hub token create|list|revoke``."""
    try:
        args = token_parser().parse_args(argv)
    except SystemExit as e:  # argparse already wrote the usage error (2) or the help (0)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    args.creates = args.command == "create"  # the first token may come before the hub

    async def work(tokens: TokenStore, _key: object) -> int:
        if args.command == "create":
            print(await tokens.create(role=args.role, name=args.name, plan=args.plan))
            print("this token is shown only once; store it now", file=sys.stderr)
        elif args.command == "list":
            _print_table(await tokens.list())
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
    try:
        args = key_parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_USAGE

    async def work(_tokens: object, signing_key: Callable[[], Awaitable[Ed25519PrivateKey]],
                   ) -> int:
        public = (await signing_key()).public_key()
        print(public_key_text(public))
        print(f"key id {key_id(public)}; pin it with: [entitlement] public_keys = "
              f'["{public_key_text(public)}"]', file=sys.stderr)
        return EXIT_OK

    return _run("syncd hub key", args, work)
