"""``syncd hub``: running the reference control plane, and routing its admin commands
(``hub token|key|invite``) to ``syncd/hub/admin.py`` with the hub's store found."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from syncd.exits import EXIT_CONFIG

HUB_ADMIN = ("token", "key", "invite")
_HUB_WHERE = ("--data-dir", "--store", "--store-file")


def hub_admin(before: list[str], command: str, rest: list[str]) -> int:
    """``syncd hub token|key|invite``, which ``hub.admin`` parses. The hub's store is the one
    named after the command (``--data-dir``, ``--store``, ``--store-file``), else a
    ``--data-dir`` given before ``hub``, else the config's (``[hub] store``, ``store_file``
    or ``data_dir``, as ``syncd hub`` itself uses); ``--config`` goes before or after."""
    from syncd.hub import admin
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--config", type=Path)
    options.add_argument("--data-dir", type=Path)
    given = options.parse_known_args(before)[0]
    late = argparse.ArgumentParser(add_help=False)
    late.add_argument("--config", type=Path)
    after, rest = late.parse_known_args(rest)
    config_path = after.config or given.config
    named = any(word.partition("=")[0] in _HUB_WHERE for word in rest)
    if not named and not {"-h", "--help"} & set(rest):
        if given.data_dir is not None:
            rest = [*rest, "--data-dir", str(given.data_dir)]
        else:
            from syncd.config import ConfigError, load_config
            try:
                hub = load_config(config_path).hub
            except ConfigError as exc:
                print(f"syncd: {exc}", file=sys.stderr)
                return EXIT_CONFIG
            rest = [*rest, *(["--store-file", str(hub.store_file)] if hub.store_file else
                              ["--store", hub.store] if hub.store != "sqlite" else
                              ["--data-dir", str(hub.data_dir.expanduser())])]
    if command == "token":
        return admin.token_main(rest)
    if command == "key":
        return admin.key_main(rest)
    return admin.invite_main(rest, config_path)


def hub_command(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    import asyncio

    import msgspec

    from syncd.daemon import StartupError, make_embedder
    from syncd.hub.dsn import resolve_dsn
    from syncd.hub.server import Hub
    config = settings["config"]
    data_dir = (args.hub_data_dir or args.data_dir or config.hub.data_dir).expanduser()
    try:
        if args.store is not None or args.store_file is not None:
            dsn = resolve_dsn(args.store, args.store_file)
        else:
            dsn = resolve_dsn(config.hub.store, config.hub.store_file)
    except ValueError as exc:
        print(f"syncd hub: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        hub = Hub(data_dir=data_dir, dsn=dsn, host=settings["host"], port=settings["port"],
                  embedder=make_embedder(config.embedding, idle_unload=False),
                  config=msgspec.structs.replace(config.hub,
                                                 cursor=args.cursor or config.hub.cursor),
                  shutdown_timeout=config.daemon.shutdown_timeout_secs)
        return asyncio.run(hub.run(ready=lambda url: print(f"syncd hub: ready on {url}",
                                                           file=sys.stderr, flush=True)))
    except StartupError as exc:
        print(f"syncd hub: {exc}", file=sys.stderr)
        return exc.exit_code
