"""The commands that set this machine up: ``setup`` (an agent's config files), ``join``
(pairing with a hub), ``service`` (the systemd unit or launchd agent) and ``license`` (an
offline licence)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from syncd.client import Client, ClientError
from syncd.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_TEMPFAIL
from syncd.report import when


def license_command(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    """Verify a licence against the pinned keys and this install's device id, install it,
    and ask a running daemon to re-check now."""
    import sqlite3

    from syncd.entitlement.gate import Gate
    from syncd.entitlement.token import TokenError, pin
    config, data_dir = settings["config"], settings["data_dir"]
    try:
        pinned = pin(config.entitlement.public_keys)
        raw = args.file.read_bytes()
        device = _device_id(data_dir)
        claims = Gate(data_dir, pinned, device,
                      license_file=config.entitlement.license_file).install_license(raw)
    except TokenError as exc:
        print(f"syncd license: {args.file}: {exc.reason}: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, OSError, sqlite3.Error) as exc:
        print(f"syncd license: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps({"plan": claims.plan, "features": list(claims.features),
                      "exp": claims.exp, "device": device}) if args.json else
          f"licence installed: plan {claims.plan}, features {', '.join(claims.features)}, "
          f"valid until {when(claims.exp)} (device {device})")
    try:
        Client.for_data_dir(data_dir, settings["url"], timeout=5).call(
            "POST", "/v1/agent/entitlement/check", {})
    except ClientError:
        pass  # not running: it reads the licence when it starts
    return EXIT_OK


def _device_id(data_dir: Path) -> str:
    """This install's device id: the store's replica id (read-only; the daemon may run)."""
    from local_store.db import DB_FILENAME, replica_id_of
    db = data_dir / DB_FILENAME
    if not db.exists():
        raise ValueError(f"no store in {data_dir}: run `syncd run` once first")
    replica = replica_id_of(db)
    if replica is None:
        raise ValueError(f"{db} has no replica id")
    return replica


def service_command(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from syncd import service
    from syncd.config import default_config_path
    from syncd.places import default_cache_dir
    platform = args.platform or service.default_platform()
    if args.action == "status":
        return service.status(platform)
    if args.action == "uninstall":
        return service.uninstall(platform)
    config = (args.config or default_config_path()).expanduser().absolute()
    daemon = settings["config"].daemon
    socket = None if daemon.unix_socket is None else daemon.unix_socket.absolute()
    paths = service.Paths(config=config, data_dir=Path(settings["data_dir"]).absolute(),
                          log_dir=Path.home() / "Library" / "Logs" / "syncd",
                          socket_dir=None if socket is None else socket.parent,
                          shutdown_secs=daemon.shutdown_timeout_secs,
                          cache_dir=default_cache_dir().absolute())
    try:  # a path a unit cannot hold is refused before anything is written
        if args.print_only:
            sys.stdout.write(service.render(platform, paths))
            return EXIT_OK
        return service.install(platform, paths)
    except ValueError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def setup_command(args: argparse.Namespace) -> int:
    from syncd import setup
    command, extra = setup.syncd_command(), setup.global_args(args.config, args.data_dir)
    if args.agent == "mcp":
        print(json.dumps({"mcpServers": {setup.SERVER_NAME: setup.server_entry(command, extra)}},
                         indent=2))
        return EXIT_OK
    try:
        changes = setup.claude_code(args.settings.expanduser(), args.mcp_config.expanduser(),
                                    command=command, args=extra, uninstall=args.uninstall)
    except setup.SetupError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for change in changes:
        if args.dry_run:
            print(f"--- {change.path}" + ("" if change.changed else " (unchanged)"))
            print(change.text, end="")
        elif not change.changed:
            print(f"unchanged {change.path}")
        else:
            setup.write(change)
            kept = "" if change.before is None else \
                f" (the previous one is {change.path}{setup.BACKUP_SUFFIX})"
            print(f"{'created' if change.before is None else 'updated'} {change.path}{kept}")
    return EXIT_OK


def join_command(args: argparse.Namespace) -> int:
    """``syncd join``: rules in ``syncd/join.py``; the token is never printed."""
    from syncd.config import default_config_path
    from syncd.join import JoinError, join
    config = (args.config or default_config_path()).expanduser().absolute()
    invite = sys.stdin.readline() if args.invite == "-" else args.invite
    given = args.data_dir
    data_dir = None if given is None else given.expanduser().absolute()
    try:
        done = join(invite, config, data_dir, force=args.force)
    except JoinError as exc:
        print(f"syncd join: {exc.message}", file=sys.stderr)
        return {"usage": EXIT_CONFIG, "unreachable": EXIT_TEMPFAIL}.get(exc.kind, EXIT_FAILED)
    if args.json:
        print(json.dumps(done, indent=2))
        return EXIT_OK
    print(f"joined {done['hub']} as {done['name']!r} (role {done['role']}, plan "
          f"{done['plan']}: {', '.join(done['features']) or 'no paid features'})")
    print(f"  wrote the token to {done['token_file']} (0600; it is shown nowhere else)")
    print(f"  {'updated' if done['backup'] else 'created'} {done['config']}: "
          f"{', '.join(done['changed']) or 'nothing changed'}"
          + (f" (the previous one is {done['backup']})" if done['backup'] else ""))
    print(f"  pinned the hub's entitlement key {done['key_id']} ({done['public_key']})")
    print("  checked: the hub answered with an entitlement signed by that key")
    if done["daemon_running"]:
        print("next: restart the daemon, which reads its config only when it starts (`syncd "
              "stop`, then `syncd run`; a service manager starts it again by itself)")
    else:
        print("next: start the daemon (`syncd run`, or `syncd service install`)")
    return EXIT_OK
