"""What a command runs with: the config file, ``SYNCD_*`` and the flags, resolved into the
config, the data directory, the address and how to tell a person the daemon is not running."""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def command_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Config file + SYNCD_* env + flags → what the commands need."""
    from syncd.addresses import local_url, parse_listen
    from syncd.config import ConfigError, load_config, parse_config
    env = dict(os.environ)
    if getattr(args, "allow_non_loopback", False):  # the flag is the setting, for the file too
        env["SYNCD_DAEMON_ALLOW_NON_LOOPBACK"] = "true"
    try:
        if _creates_config(args):  # the defaults (and SYNCD_*), as the new file will hold
            config = parse_config(b"", env=env)
        else:
            config = load_config(args.config, env)
        default_listen = config.hub.listen if args.command == "hub" else config.daemon.listen
        flag = getattr(args, "listen", None)
        try:
            host, port = parse_listen(flag or default_listen)
        except ValueError as exc:
            if flag is None:  # the config's value: its own check names it
                raise
            raise ValueError(f"--listen {flag[:80]}: {exc}") from None
    except (ConfigError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    data_dir = args.data_dir.expanduser() if args.data_dir else Path(config.daemon.data_dir)
    # "url" is where a client reaches the daemon before its state file says (0.0.0.0 → loopback)
    return {"config": config, "data_dir": data_dir, "host": host, "port": port,
            "url": local_url(host, port), "listen_source": _listen_source(args, env, config),
            "start": _start_command(args)}


def _listen_source(args: argparse.Namespace, env: Mapping[str, str], config: Any) -> str:
    """What set the daemon's address a client tries, as a phrase for "not running"."""
    from syncd.config import default_config_path, parse_config
    if getattr(args, "listen", None):
        return f"--listen {args.listen}"
    if env.get("SYNCD_DAEMON_LISTEN"):
        return f"SYNCD_DAEMON_LISTEN={env['SYNCD_DAEMON_LISTEN']}"
    path = (args.config or default_config_path(env)).expanduser().absolute()
    if config.daemon.listen != parse_config(b"", env={}).daemon.listen:
        return f"daemon.listen in {path}"
    where = f"none is set in {path}" if path.exists() else f"there is no {path}"
    return f"daemon.listen's default, {config.daemon.listen} ({where})"


def _start_command(args: argparse.Namespace) -> str:
    """``syncd run`` with the options that chose this data dir and config."""
    words = ["syncd"]
    if args.config is not None:
        words += ["--config", shlex.quote(str(args.config.expanduser().absolute()))]
    if args.data_dir is not None:
        words += ["--data-dir", shlex.quote(str(args.data_dir.expanduser().absolute()))]
    return " ".join([*words, "run"])


def _creates_config(args: argparse.Namespace) -> bool:
    """``service install`` with ``--config`` naming a file that is not there yet: install
    creates it, so it is not an error to read it first."""
    return (args.command == "service" and getattr(args, "action", None) == "install"
            and args.config is not None and not args.config.expanduser().exists())
