"""The ``syncd`` command line: reads the arguments, resolves the settings, and hands each
command to its module in ``syncd/commands/`` (``syncd/commands/__init__.py`` lists them).

Exit codes: 0 ok · 1 the request failed (the message says why) · 2 usage or configuration
error · 75 temporary failure (daemon not running or answering 503 as it stops, data dir in
use, port taken).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from syncd.client import Client, ClientError, DaemonDown
from syncd.commands.daemon import (
    mcp_command,
    open_command,
    run_command,
    status_command,
    stop_command,
    sync_command,
)
from syncd.commands.data import backup_command, export_command, import_command, restore_command
from syncd.commands.hub import HUB_ADMIN, hub_admin, hub_command
from syncd.commands.install import join_command, license_command, service_command, setup_command
from syncd.commands.memories import (
    delete_command,
    edit_command,
    get_command,
    history_command,
    list_command,
    recall_command,
    save_command,
)
from syncd.commands.parser import build_parser
from syncd.commands.settings import command_settings
from syncd.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_TEMPFAIL


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader left early (`syncd export | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit flush too
        return EXIT_FAILED


def _command_at(argv: list[str]) -> int:
    """Where the subcommand is: after the global options ``--config`` and ``--data-dir``, in
    any order, spelled ``--opt X`` or ``--opt=X`` or abbreviated as argparse allows. Only
    ``hub token``/``hub key`` there are the hub's admin commands: ``syncd recall --realm hub
    key`` is a recall."""
    at = 0
    while at < len(argv):
        name, eq, _ = argv[at].partition("=")
        if len(name) < 3 or not name.startswith("--") or sum(
                option.startswith(name) for option in _GLOBAL_VALUED) != 1:
            return at
        at += 1 if eq else 2
    return at


_GLOBAL_VALUED = ("--config", "--data-dir")


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    at = _command_at(argv)
    if argv[at:at + 1] == ["hub"] and argv[at + 1:at + 2] and argv[at + 1] in HUB_ADMIN:
        return hub_admin(argv[:at], argv[at + 1], argv[at + 2:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "recall" and args.hook:
        return _hook(args)
    if args.command == "recall" and args.query is None:
        parser.error("recall: QUERY is required (unless --hook)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s", stream=sys.stderr)
    if args.command == "setup":
        return setup_command(args)
    if args.command == "completion":
        from syncd.completion import script
        print(script(args.shell, build_parser()), end="")
        return EXIT_OK
    if args.command == "join":
        return join_command(args)
    if args.command == "demo":
        import asyncio

        from syncd.demo import run_demo
        code: int = asyncio.run(run_demo())
        return code
    try:
        settings = command_settings(args)
    except ValueError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    # the daemon's level (its default, info, is what was set above)
    logging.getLogger().setLevel(settings["config"].daemon.log_level.upper())
    if args.command == "run":
        return run_command(args, settings)
    if args.command == "hub":
        return hub_command(args, settings)
    if args.command == "license":
        return license_command(args, settings)
    if args.command == "backup":
        return backup_command(settings["data_dir"], args.dest, args.json)
    if args.command == "restore":
        return restore_command(settings["data_dir"], args.source, args.json)
    if args.command == "mcp":
        return mcp_command(args, settings)
    if args.command == "service":
        return service_command(args, settings)
    try:
        client = Client.for_data_dir(settings["data_dir"], settings["url"],
                                     listen_source=settings["listen_source"],
                                     start=settings["start"])
        if args.command == "import":  # its batches stay under the daemon's body limit
            return import_command(client, args, settings["config"].daemon.max_body_bytes)
        return COMMANDS[args.command](client, args)
    except DaemonDown as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_TEMPFAIL
    except ClientError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        # 503: stopping, or its store closing — the same command works once it runs again
        return EXIT_TEMPFAIL if exc.status == 503 else EXIT_FAILED


def _hook(args: argparse.Namespace) -> int:
    """``recall --hook``, when ``syncd.entry`` left the command line to argparse (``python -m
    syncd`` spelled another way, an abbreviation, an extra option): the same code."""
    from syncd.hook import run_hook
    return run_hook(args.config, args.data_dir)


COMMANDS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "status": status_command, "recall": recall_command, "save": save_command,
    "stop": stop_command, "list": list_command, "get": get_command,
    "history": history_command, "delete": delete_command, "edit": edit_command,
    "export": export_command, "sync": sync_command, "open": open_command,
}  # and import, with its limit


if __name__ == "__main__":
    sys.exit(main())
